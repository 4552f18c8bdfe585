package fwbpf

import (
	"testing"

	"github.com/naplesnet/naples/hal/firewall"
)

// TestCutStopsOnlyTheDeniedDirection checks the example of docs/firewall.md (Semantics,
// "Policy change on established connections"). b1 is the endpoint on ifA, c2 a peer:
// b1's ingress lets in UDP 53 and TCP 5432 from c2, b1's egress is open. Three
// connections from c2 to b1 are tracked. Then the policy denies them at b1's ingress (no
// rule allows them any more) and leaves b1's egress open. The first packet of each
// connection after the change, in either direction, is dropped and its entry deleted:
// the connection was c2's, and c2 may not make it now. From then on c2's packets to b1
// are dropped (new connections c2 may not make) until b1 sends to c2 again: b1's next
// packet is a new connection of b1's, which its open egress allows (TCP too, with no
// SYN), and c2's packets pass as its replies. So the cut holds in the direction the
// policy denies only while b1 sends nothing.
func TestCutStopsOnlyTheDeniedDirection(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f *fixture, fam family) {
		b1, c2 := fam.ep, fam.peer
		peers := identity(scope1, hostPrefix(c2), idPeer)
		f.install(peers, endpoint(f.ifA, epA, subject, firewall.FlagIngress, gen1),
			policy(firewall.DirIngress, firewall.ClassUDP, idPeer, 53, 16, firewall.VerdictAllow, 51),
			policy(firewall.DirIngress, firewall.ClassTCP, idPeer, 5432, 16, firewall.VerdictAllow, 52))
		first := udp(c2, 40000, b1, 53)  // c2 sends first after the change
		second := udp(c2, 40001, b1, 53) // b1 sends first after the change
		stream := tcp(c2, 40002, b1, 5432, tcpSYN)
		for _, p := range []packet{first, second, stream} {
			f.to(f.ifA, p, tcxNext)
			answer := p.reply()
			if p.proto == ipProtoTCP {
				answer.tcpFlags = tcpSYN | tcpACK
			}
			f.from(f.ifA, answer, tcxNext)
		}

		// The change: b1's ingress protected by no rule, its egress open.
		f.install(peers, endpoint(f.ifA, epA, subject, firewall.FlagIngress, gen2))

		// c2 sends first: dropped, and the connection is gone; c2's next datagram is a
		// new connection c2 may not make.
		f.to(f.ifA, first, tcxDrop)
		f.noConn(f.ifA, first)
		f.to(f.ifA, first, tcxDrop)
		f.noConn(f.ifA, first)
		// b1 answers: a new connection of b1's, allowed by its open egress; c2's
		// datagrams pass again, as its replies.
		f.from(f.ifA, first.reply(), tcxNext)
		if v := f.mustConn(f.ifA, first.reply()); v.Dir != DirEgress || v.Gen != gen2 {
			t.Errorf("entry of b1's datagram after the cut %+v, want dir egress, gen %#x", v, gen2)
		}
		f.to(f.ifA, first, tcxNext)

		// b1 sends first: its datagram is dropped too (the connection's original
		// direction, from c2, is checked again and denied) and the connection is gone;
		// b1's next datagram is a new connection of b1's, and c2's pass as its replies.
		f.from(f.ifA, second.reply(), tcxDrop)
		f.noConn(f.ifA, second)
		f.from(f.ifA, second.reply(), tcxNext)
		f.to(f.ifA, second, tcxNext)

		// TCP alike: b1's segment is dropped, its retransmission is a new connection of
		// b1's (no SYN needed), and c2's segments pass as its replies.
		push := stream.reply()
		push.tcpFlags = tcpACK
		f.from(f.ifA, push, tcxDrop)
		f.noConn(f.ifA, stream)
		f.from(f.ifA, push, tcxNext)
		ack := stream
		ack.tcpFlags = tcpACK
		f.to(f.ifA, ack, tcxNext)

		// Created: three before the change, three of b1's after; deleted: three.
		f.wantStats(6, 3, 0)
	})
}

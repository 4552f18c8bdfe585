package linux

import (
	"context"
	"strings"
	"testing"

	"github.com/naplesnet/naples/hal"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// newNodeReconciler returns a node reconciler for the test host, this host being
// localNode.
func (h *overlayHost) newNodeReconciler(t *testing.T) *NodeReconciler {
	t.Helper()
	r, err := NewNodeReconciler(NodeOptions{Store: h.store, Node: localNode, Namespace: &h.nsh, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// observeNodes runs the node reconciler's observer until the test ends and returns
// once it is subscribed; the keys it enqueues arrive on the returned channel.
func observeNodes(t *testing.T, r *NodeReconciler) <-chan string {
	t.Helper()
	return runObserver(t, r)
}

// TestNodeReconciler: this host's Node waits for its VTEP address to be on an interface
// (and usable: not tentative), and the observer enqueues it whenever that address comes
// or goes; other nodes report their VTEP address.
func TestNodeReconciler(t *testing.T) {
	h := newOverlayHost(t)
	h.run(t, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
	h.run(t, "ip", "link", "set", "eth0", "up")
	r := h.newNodeReconciler(t)
	local := nodeObj(localNode, "192.0.2.10")
	h.put(t, local, nodeObj("n2", "192.0.2.20"), nodeObj("n3", ""))
	reconcile := func(name string) (*nimbusv1.NodeOperational, error) {
		key := NodeKey(name)
		obj, _ := h.store.Get(key)
		op, err := r.Reconcile(context.Background(), key, obj)
		return op.GetNode(), err
	}
	enqueued := observeNodes(t, r)

	for name, want := range map[string]string{"n2": "192.0.2.20", "n3": ""} {
		op, err := reconcile(name)
		if err != nil || op.GetRole() != nimbusv1.NodeRole_NODE_ROLE_REMOTE || op.GetVtep() != want {
			t.Errorf("reconcile %s = %v, %v; want role remote, vtep %q", name, op, err, want)
		}
	}
	pendingFor := func(what string) {
		t.Helper()
		_, err := reconcile(localNode)
		if !hal.IsPending(err) || hal.ReasonOf(err) != ReasonWaitingForAddress || !strings.Contains(err.Error(), what) {
			t.Fatalf("reconcile of this host's Node: err = %v, want PENDING %s saying %q", err, ReasonWaitingForAddress, what)
		}
	}
	programmed := func(vtep string) {
		t.Helper()
		op, err := reconcile(localNode)
		if err != nil || op.GetRole() != nimbusv1.NodeRole_NODE_ROLE_LOCAL || op.GetVtep() != vtep {
			t.Fatalf("reconcile of this host's Node = %v, %v; want role local, vtep %s", op, err, vtep)
		}
	}
	pendingFor("192.0.2.10")

	// Another address is not the VTEP's; the VTEP address enqueues this host's Node.
	h.run(t, "ip", "addr", "add", "192.0.2.11/24", "dev", "eth0")
	pendingFor("192.0.2.10")
	h.run(t, "ip", "addr", "add", "192.0.2.10/24", "dev", "eth0")
	if id := nextEnqueued(t, enqueued, "the VTEP address added"); id != NodeKey(localNode).ID() {
		t.Fatalf("enqueued %s, want %s", id, NodeKey(localNode).ID())
	}
	programmed("192.0.2.10")
	h.run(t, "ip", "addr", "del", "192.0.2.10/24", "dev", "eth0")
	if id := nextEnqueued(t, enqueued, "the VTEP address removed"); id != NodeKey(localNode).ID() {
		t.Fatalf("enqueued %s, want %s", id, NodeKey(localNode).ID())
	}
	pendingFor("192.0.2.10")

	// IPv6: an address still tentative (eth0 has no carrier: its peer is down, so
	// duplicate address detection waits) is not usable yet.
	h.put(t, nodeObj(localNode, "2001:db8::10"))
	h.run(t, "ip", "addr", "add", "2001:db8::10/64", "dev", "eth0")
	nextEnqueued(t, enqueued, "the IPv6 VTEP address added")
	pendingFor("tentative")
	h.run(t, "ip", "addr", "del", "2001:db8::10/64", "dev", "eth0")
	h.run(t, "ip", "addr", "add", "2001:db8::10/64", "dev", "eth0", "nodad")
	waitFor(t, "the IPv6 VTEP address to be usable", func() bool {
		_, err := reconcile(localNode)
		return err == nil
	})
	programmed("2001:db8::10")

	// Without a VTEP address there is nothing to wait for.
	h.put(t, nodeObj(localNode, ""))
	if op, err := reconcile(localNode); err != nil || op.GetRole() != nimbusv1.NodeRole_NODE_ROLE_LOCAL || op.GetVtep() != "" {
		t.Errorf("reconcile of this host's Node without a VTEP address = %v, %v; want role local and no vtep", op, err)
	}

	// A Node deleted has nothing to report.
	if op, err := r.Reconcile(context.Background(), NodeKey("n2"), nil); err != nil || op != nil {
		t.Errorf("reconcile of a deleted Node = %v, %v", op, err)
	}
}

package linux

import (
	"testing"
	"time"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestNetworkReconciledOnce: a network added to a quiet namespace is reconciled once.
// The kernel's notifications of what its reconcile wrote (the links' creates, with the
// settings the kernel reports before and after each, their aliases, MTUs, ports and port
// flags, the forwarding settings the kernel reports created with the bridge, and the
// IPv6 forwarding the reconcile sets) are echoes of its own writes, and the observer
// enqueues the network for none of them. A marker, a link that someone else gives the
// alias of another network, tells when the observer has handled every notification
// that came before it.
func TestNetworkReconciledOnce(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(h *overlayHost) *nimbusv1.ObjectKey
	}{
		{"IPv4", func(h *overlayHost) *nimbusv1.ObjectKey {
			// The benchmark's network: an IPv4 gateway, the MTU the underlay carries.
			h.run(t, "ip", "addr", "add", benchVTEPAddr+"/32", "dev", "lo")
			obj := benchNetworkObj(0)
			h.put(t, nodeObj(localNode, benchVTEPAddr), obj)
			return obj.Key()
		}},
		{"DualStack", func(h *overlayHost) *nimbusv1.ObjectKey { return h.dualStack(t).key }},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newOverlayHost(t)
			key := c.setup(h)
			enqueued := h.observeNetworks(t)
			h.mustReconcile(t, key)

			marker := networkObj("acme", "marker", 999, 0).Key().ID()
			h.run(t, "ip", "link", "add", "nmarker", "up", "type", "bridge")
			h.run(t, "ip", "link", "set", "nmarker", "alias", OwnerAlias(marker))
			reconciles := 1
			for {
				id := nextEnqueued(t, enqueued, "the marker")
				if id == marker {
					break
				}
				if id != key.ID() {
					t.Fatalf("the observer enqueued %s, want %s or the marker", id, key.ID())
				}
				reconciles++
			}
			if reconciles != 1 {
				t.Errorf("the network was reconciled %d times until settled, want 1: the observer took the echoes of its writes for changes", reconciles)
			}
			writes := h.rec.KernelWrites()
			h.mustReconcile(t, key)
			if d := h.rec.KernelWrites() - writes; d != 0 {
				t.Errorf("a second reconcile wrote the kernel %d times", d)
			}
		})
	}
}

// TestNetworkCreateReadsNoLink: adding a network reads none of the links it creates
// back from the kernel: the view's link table holds each as created once the view has
// read the kernel's reports of the create, which the kernel queues before its ack.
func TestNetworkCreateReadsNoLink(t *testing.T) {
	h := newOverlayHost(t)
	h.run(t, "ip", "addr", "add", benchVTEPAddr+"/32", "dev", "lo")
	obj := benchNetworkObj(0)
	h.put(t, nodeObj(localNode, benchVTEPAddr), obj)
	h.observeNetworks(t)
	// However slow the machine, the view reads the create's reports in time.
	h.rec.createdLinkWait = 30 * time.Second
	gets := h.rec.linkGets.Load()
	h.mustReconcile(t, obj.Key())
	if d := h.rec.linkGets.Load() - gets; d != 0 {
		t.Errorf("adding a network read %d of the links it created back from the kernel, want 0", d)
	}
	if _, ok := h.rec.link(BridgeName(obj.Key().ID())); !ok {
		t.Errorf("the link table holds no bridge %s", BridgeName(obj.Key().ID()))
	}
}

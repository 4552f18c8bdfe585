package hal_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/naplesnet/naples/hal"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// dependent is a fake reconciler whose objects depend on objects of another kind.
type dependent struct {
	*fakeReconciler
	on   nimbusv1.Kind
	deps map[nimbusv1.Key][]nimbusv1.Key // the dependents of each key of kind on
}

var _ hal.Dependent = dependent{}

func (d dependent) DependsOn() []nimbusv1.Kind { return []nimbusv1.Kind{d.on} }

func (d dependent) DependentsOf(key nimbusv1.Key) []nimbusv1.Key { return d.deps[key] }

// TestPendingWaitsForWhatItDependsOn runs an Interface that waits for a Network: while
// the network is not programmed the interface is PENDING with the reason and message of
// its pending error and is not retried however much time passes; the network's first
// success enqueues it at once, and a later change of the network in the store enqueues
// it again.
func TestPendingWaitsForWhatItDependsOn(t *testing.T) {
	network := object(nimbusv1.Kind_KIND_NETWORK, "blue", 1)
	iface := object(nimbusv1.Kind_KIND_INTERFACE, "eth7", 1)
	networks := newFakeReconciler(nimbusv1.Kind_KIND_NETWORK)
	ifaces := dependent{newFakeReconciler(nimbusv1.Kind_KIND_INTERFACE), nimbusv1.Kind_KIND_NETWORK,
		map[nimbusv1.Key][]nimbusv1.Key{id(network): {id(iface)}}}
	networks.block(id(network))
	ifaces.fail(id(iface), 1<<30, hal.Pendingf("WaitingForNetwork", "waiting for network %s", "blue"))

	store := newFakeStore(network, iface)
	h := start(t, store, hal.Options{Reconcilers: []hal.Reconciler{networks, ifaces}, ResyncInterval: -1})
	waitFor(t, "the interface PENDING", func() bool {
		st, _ := store.status(id(iface))
		return st.GetPhase() == nimbusv1.Phase_PHASE_PENDING && st.GetReason() == "WaitingForNetwork" &&
			st.GetMessage() == "waiting for network blue"
	}, func() string { st, _ := store.status(id(iface)); return fmt.Sprint(st) })

	// No backoff retries: an hour later, and once every worker has finished what it took,
	// the interface was reconciled no more. (The store's first keys may reconcile it
	// twice: once for itself, once as a dependent of the network.)
	h.barrier()
	pending := ifaces.callsOf(id(iface))
	h.clock.Step(time.Hour)
	h.barrier()
	if n := ifaces.callsOf(id(iface)); n != pending {
		t.Fatalf("pending interface reconciled %d times, %d of them while it waited an hour; want none", n, n-pending)
	}

	ifaces.fail(id(iface), 0, nil)
	networks.release(id(network))
	waitFor(t, "the interface PROGRAMMED once its network is", func() bool {
		st, _ := store.status(id(iface))
		return st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED
	}, ifaces.describe)
	h.barrier()
	if n := ifaces.callsOf(id(iface)); n != pending+1 {
		t.Errorf("interface reconciled %d times after it waited; want 1: once its network was programmed", n-pending)
	}

	store.put(object(nimbusv1.Kind_KIND_NETWORK, "blue", 2))
	waitFor(t, "the interface reconciled again after its network changed", func() bool {
		return ifaces.callsOf(id(iface)) == pending+2
	}, ifaces.describe)
	h.barrier()
	if n := ifaces.callsOf(id(iface)); n != pending+2 {
		t.Errorf("interface reconciled %d times after its network changed; want 1: a network programmed again does not enqueue it", n-pending-1)
	}
}

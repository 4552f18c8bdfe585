package linux

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/naplesnet/naples/hal"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestRouteReconcilesShareBatches: many reconciles at once, whose writes go to the kernel
// together, each end with their own route's result: the route via a gateway the kernel
// cannot reach fails alone with the kernel's reason, and every other route is programmed,
// in the kernel and in the mirror. Deleting them all at once removes every route.
func TestRouteReconcilesShareBatches(t *testing.T) {
	forEachFamily(t, func(t *testing.T, f ipFamily) {
		h := newHost(t)
		const n = 200
		objs := make([]*nimbusv1.Object, n)
		for i := range n {
			gw := f.gw1
			if i == 77 {
				gw = f.unreachableGW
			}
			objs[i] = route(fmt.Sprintf("r%03d", i), 100, bulkPrefix(f, i), gw)
		}
		h.put(t, objs...)

		errs := make([]error, n)
		var wg sync.WaitGroup
		for i, o := range objs {
			wg.Go(func() { errs[i] = h.reconcile(t, o.Key()) })
		}
		wg.Wait()
		for i, err := range errs {
			switch {
			case i == 77 && (hal.ReasonOf(err) != hal.ReasonKernelError || !strings.Contains(fmt.Sprint(err), f.unreachableMsg)):
				t.Errorf("reconcile of the route via an unreachable gateway: err = %v, want a KernelError saying %q", err, f.unreachableMsg)
			case i != 77 && err != nil:
				t.Errorf("reconcile of %s: %v", objs[i].Key().ID(), err)
			}
		}
		if got := h.countRoutes(t, f); got != n-1 {
			t.Errorf("the kernel holds %d naples routes, want %d", got, n-1)
		}
		if got := h.rec.KernelWrites(); got != n-1 {
			t.Errorf("KernelWrites = %d, want %d", got, n-1)
		}
		for i, o := range objs {
			id, err := idOf(o.GetRoute(), o.GetMeta().GetTenant())
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := h.rec.routes.get(id); ok != (i != 77) {
				t.Errorf("mirror holds %s: %v, want %v", id, ok, i != 77)
			}
		}

		for _, o := range objs {
			h.del(t, o.Key())
		}
		for i, o := range objs {
			wg.Go(func() { errs[i] = h.rec.reconcileDeleted(o.Key()) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("removing %s: %v", objs[i].Key().ID(), err)
			}
		}
		if got := h.countRoutes(t, f); got != 0 {
			t.Errorf("the kernel holds %d naples routes after every object was deleted", got)
		}
	})
}

// reconcileDeleted runs the reconcile of a key whose object is gone, as the HAL does.
func (r *RouteReconciler) reconcileDeleted(key *nimbusv1.ObjectKey) error {
	_, err := r.Reconcile(context.Background(), key, nil)
	return err
}

package test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"google.golang.org/grpc"

	"github.com/naplesnet/naples/internal/testrand"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// ackedRoute is what an acknowledged write left of one route: its gateway and generation,
// or deleted.
type ackedRoute struct {
	gw         string
	generation int64
	deleted    bool
}

// TestNimbusKilledKeepsAcknowledgedWrites SIGKILLs a durable nimbus while one writer
// applies and deletes routes one call at a time (each a commit of its own, which nimbus's
// state file logs), five times at random points, and checks after each restart that
// nimbus holds every write it acknowledged: each route as its last acknowledged write
// left it, except the one write under way when nimbus died, which may or may not have
// been stored. The seed is logged; NAPLES_TEST_SEED replays a run.
func TestNimbusKilledKeepsAcknowledgedWrites(t *testing.T) {
	rng := rand.New(rand.NewPCG(testrand.Seed(t), 0))
	c := newCluster(t)
	api := c.publisherAPI(t)
	acked := map[string]ackedRoute{}
	writes := 0
	for round := range 5 {
		killAfter := 1 + rng.IntN(150) // acknowledged writes; the writer takes rng then
		ctx, cancel := context.WithCancel(context.Background())
		acks := make(chan struct{}, 1)
		// inflight is the write under way when the writer stopped: nimbus may have stored
		// it without answering.
		var inflight struct {
			name string
			to   ackedRoute
		}
		writerDone := make(chan struct{})
		go func() {
			defer close(writerDone)
			for ctx.Err() == nil {
				name := fmt.Sprintf("r%02d", rng.IntN(40))
				if rng.IntN(4) == 0 {
					inflight.name, inflight.to = name, ackedRoute{deleted: true}
					if _, err := api.Delete(ctx, &nimbusv1.DeleteRequest{Key: nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", name)}); err != nil {
						return
					}
					acked[name] = ackedRoute{deleted: true}
				} else {
					gw := fmt.Sprintf("192.0.2.%d", 1+rng.IntN(200))
					inflight.name, inflight.to = name, ackedRoute{gw: gw}
					resp, err := api.Apply(ctx, &nimbusv1.ApplyRequest{Object: &nimbusv1.Object{
						Meta: &nimbusv1.ObjectMeta{Name: name, Nodes: []string{"host-a"}},
						Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{Table: 100, Prefix: "10.0.0.0/24",
							Nexthops: []*nimbusv1.NextHop{{Gateway: gw}}}},
					}})
					if err != nil {
						return
					}
					acked[name] = ackedRoute{gw: gw, generation: resp.GetObject().GetMeta().GetGeneration()}
				}
				inflight.name = ""
				writes++
				select {
				case acks <- struct{}{}:
				default:
				}
			}
		}()
		for range killAfter {
			<-acks
		}
		c.nimbus.kill(t)
		cancel()
		<-writerDone
		c.startNimbus(t)

		lctx, lcancel := context.WithTimeout(context.Background(), deadline)
		resp, err := nimbusv1.ListAll(lctx, api, &nimbusv1.ListRequest{Kind: nimbusv1.Kind_KIND_ROUTE}, grpc.WaitForReady(true))
		lcancel()
		if err != nil {
			t.Fatalf("round %d: listing routes after the restart: %v", round, err)
		}
		list := resp.GetItems()
		stored := map[string]ackedRoute{}
		for _, item := range list {
			o := item.GetObject()
			stored[o.GetMeta().GetName()] = ackedRoute{gw: o.GetRoute().GetNexthops()[0].GetGateway(), generation: o.GetMeta().GetGeneration()}
		}
		for name := range 40 {
			name := fmt.Sprintf("r%02d", name)
			want, written := acked[name]
			got, ok := stored[name]
			if name == inflight.name {
				// The write under way: either state is right.
				if ok == !inflight.to.deleted && (!ok || got.gw == inflight.to.gw) {
					acked[name] = got
					if !ok {
						acked[name] = ackedRoute{deleted: true} // the delete was stored
					}
					continue
				}
			}
			switch {
			case !written:
				if ok {
					t.Errorf("round %d: %s is stored (%+v) though no write of it was acknowledged", round, name, got)
				}
			case want.deleted && ok:
				t.Errorf("round %d: %s was deleted, acknowledged, and is stored again after the restart: %+v", round, name, got)
			case !want.deleted && !ok:
				t.Errorf("round %d: %s was applied with gateway %s, acknowledged, and is missing after the restart", round, name, want.gw)
			case !want.deleted && (got.gw != want.gw || got.generation != want.generation):
				t.Errorf("round %d: %s is stored with gateway %s at generation %d; the last acknowledged write set %s at generation %d",
					round, name, got.gw, got.generation, want.gw, want.generation)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
		t.Logf("round %d: killed nimbus after %d writes acknowledged in all; %d routes stored", round, writes, len(stored))
	}
}

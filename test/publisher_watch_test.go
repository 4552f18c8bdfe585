package test

import (
	"context"
	"strings"
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestPublisherWatchIsNoTarget is issue 19's "watching makes a target" with real
// binaries: a publisher watching a phantom node, the way to see what a node would
// receive, does not make it a target, so apply --wait returns once the one real agent has
// the route, and get shows 1/1.
func TestPublisherWatchIsNoTarget(t *testing.T) {
	c := newCluster(t)
	c.newHost(t, "host-a")

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := c.publisherAPI(t).Watch(ctx, &nimbusv1.WatchRequest{Node: "phantom-1"})
	if err != nil {
		t.Fatal(err)
	}
	for synced := false; !synced; {
		frame, err := stream.Recv()
		if err != nil {
			t.Fatalf("watching phantom-1: %v", err)
		}
		for _, ev := range frame.GetEvents() {
			synced = synced || ev.GetType() == nimbusv1.WatchEvent_TYPE_SYNCED
		}
	}

	if _, err := c.ctl(t, toAll, "apply", "-f", "-", "--wait", "--timeout", "30s"); err != nil {
		t.Fatalf("apply --wait of a route for every node with a publisher watching phantom-1: %v", err)
	}
	_, st, err := c.get(t, "route", "to-all")
	if err != nil {
		t.Fatal(err)
	}
	if st.GetTargetNodes() != 1 || st.GetProgrammedNodes() != 1 || strings.Contains(strings.Join(st.GetPending(), ","), "phantom") {
		t.Errorf("status = %d/%d programmed, pending %q; want 1/1 with host-a alone", st.GetProgrammedNodes(), st.GetTargetNodes(), st.GetPending())
	}
}

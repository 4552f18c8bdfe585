package controller

import (
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func TestClientFailsOverBetweenReplicas(t *testing.T) {
	first, second := socketPath(t), socketPath(t)
	s1 := serve(t, first, "")
	serve(t, second, "")
	c, err := New(Options{Address: "unix://" + first + ",unix://" + second, Logger: quiet,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Apply(testContext(t), route("r1", "192.0.2.1")); err != nil {
		t.Fatalf("Apply with both up: %v", err)
	}
	// Whichever the client used, with the first gone it applies through the second.
	s1.stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := c.Apply(testContext(t), route("r2", "192.0.2.1"))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Apply with the first replica down: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := rawClient(t, second).Get(testContext(t), &nimbusv1.GetRequest{Key: routeKey("r2")}); err != nil {
		t.Fatalf("the second replica does not hold what was applied after the first went: %v", err)
	}
}

// TestClientSkipsReplicaNotReady lists first a replica on etcd that cannot reach etcd, so
// is up but not ready and refuses every call, then a ready nimbus: each of 20 clients
// applies through the ready one.
func TestClientSkipsReplicaNotReady(t *testing.T) {
	notReady, ready := socketPath(t), socketPath(t)
	serveWith(t, notReady, nimbus.Options{Etcd: &nimbus.EtcdOptions{
		Config: clientv3.Config{Endpoints: []string{"unix://" + filepath.Join(t.TempDir(), "no-etcd.sock")}},
	}})
	serve(t, ready, "")
	if _, err := rawClient(t, notReady).Get(testContext(t), &nimbusv1.GetRequest{Key: routeKey("r1")}); err == nil {
		t.Fatal("the replica without etcd answers Get, want it refused")
	}
	failed := 0
	for i := range 20 {
		c, err := New(Options{Address: "unix://" + notReady + ",unix://" + ready, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Apply(testContext(t), route("r1", "192.0.2.1")); err != nil {
			t.Logf("client %d: Apply: %v", i+1, err)
			failed++
		}
		c.Close()
	}
	if failed > 0 {
		t.Errorf("%d of 20 clients failed to apply, want none", failed)
	}
}

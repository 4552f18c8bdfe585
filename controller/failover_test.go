package controller

import (
	"testing"
	"time"

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

package nimbus

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func TestPersistenceAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	ts := start(t, Options{DataDir: dir})
	ts.apply(t, route("r1", []string{"a"}, "192.0.2.1"))
	ts.apply(t, route("r2", nil, "192.0.2.1"))
	ts.apply(t, nodeObject("a"))
	ts.apply(t, route("r1", []string{"a"}, "192.0.2.2"))
	ts.apply(t, route("gone", nil, "192.0.2.1"))
	if _, err := ts.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: routeKey("gone")}); err != nil {
		t.Fatal(err)
	}
	before, err := ts.client.List(testContext(t), &nimbusv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	epoch := ts.srv.Epoch()
	if err := ts.srv.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	again := start(t, Options{DataDir: dir})
	if again.srv.Epoch() != epoch {
		t.Errorf("epoch after restart = %q, want %q", again.srv.Epoch(), epoch)
	}
	after, err := again.client.List(testContext(t), &nimbusv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if after.GetRevision() != 6 || len(after.GetItems()) != len(before.GetItems()) {
		t.Fatalf("List after restart = %d objects at revision %d, want %d at 6", len(after.GetItems()), after.GetRevision(), len(before.GetItems()))
	}
	for i, item := range after.GetItems() {
		if want := before.GetItems()[i].GetObject(); !proto.Equal(item.GetObject(), want) {
			t.Errorf("object after restart = %v, want %v", item.GetObject(), want)
		}
	}
	if got := again.get(t, routeKey("r1")).GetObject(); got.GetMeta().GetGeneration() != 2 || got.GetMeta().GetRevision() != 4 {
		t.Errorf("Get r1 after restart = generation %d revision %d, want 2 and 4", got.GetMeta().GetGeneration(), got.GetMeta().GetRevision())
	}
	wantMetrics(t, again.srv, "naples_nimbus_objects 3", "naples_nimbus_revision 6")

	// The history is empty after a restart: a watch at the last revision resumes, an
	// older one gets a snapshot.
	wantResumed(t, again, watchFrom(t, testContext(t), again.client, "a", epoch, 6), 6)
	puts, synced := recvUntilSynced(t, watchFrom(t, testContext(t), again.client, "a", epoch, 5))
	if len(puts) != 3 || synced.GetRevision() != 6 {
		t.Errorf("snapshot after restart = %d objects at revision %d, want 3 at 6", len(puts), synced.GetRevision())
	}

	if got := again.apply(t, route("r3", nil, "192.0.2.1")).GetObject().GetMeta().GetRevision(); got != 7 {
		t.Errorf("first revision after restart = %d, want 7", got)
	}
	if _, err := again.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: routeKey("r2")}); err != nil {
		t.Fatal(err)
	}
	again.srv.Close()

	// The changes after the restart are as durable as the ones before.
	third := start(t, Options{DataDir: dir})
	list, err := third.client.List(testContext(t), &nimbusv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, item := range list.GetItems() {
		names = append(names, item.GetObject().GetMeta().GetName())
	}
	if list.GetRevision() != 8 || strings.Join(names, " ") != "a r1 r3" || third.srv.Epoch() != epoch {
		t.Errorf("after a second restart: %q at revision %d epoch %q, want [a r1 r3] at 8 epoch %q", names, list.GetRevision(), third.srv.Epoch(), epoch)
	}
}

func TestEphemeralServersHaveFreshEpochs(t *testing.T) {
	a, b := start(t, Options{}), start(t, Options{})
	if a.srv.Epoch() == b.srv.Epoch() || len(a.srv.Epoch()) != 32 {
		t.Errorf("epochs %q and %q, want two different 128-bit hex strings", a.srv.Epoch(), b.srv.Epoch())
	}
}

func TestNewRefusesCorruptStore(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, DBFileName)
	if err := os.WriteFile(path, bytes.Repeat([]byte("garbage!"), 2048), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := New(Options{DataDir: dir})
	if err == nil {
		srv.Close()
		t.Fatal("New on a corrupt store succeeded")
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("New error = %q, want it to name %s", err, path)
	}
}

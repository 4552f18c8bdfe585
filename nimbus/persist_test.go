package nimbus

import (
	"bytes"
	"encoding/binary"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/internal/statefile"
	"github.com/naplesnet/naples/internal/statefile/statefiletest"
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

// storedRoute returns the wire form of a route as Apply stores it at revision rev.
func storedRoute(t *testing.T, name string, rev uint64) (id string, value []byte) {
	t.Helper()
	obj := route(name, nil, "192.0.2.1")
	obj.Meta.Tenant, obj.Meta.Namespace, obj.Meta.Generation, obj.Meta.Revision = "default", "default", 1, rev
	b, err := proto.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return obj.Key().ID(), b
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func TestNewRefusesBadStore(t *testing.T) {
	id, value := storedRoute(t, "r1", 3)
	tests := []struct {
		name  string
		write func(t *testing.T, path string)
		want  string
	}{
		{"not a bbolt file", func(t *testing.T, path string) {
			if err := os.WriteFile(path, bytes.Repeat([]byte("garbage!"), 2048), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "invalid database"},
		{"unknown format version", func(t *testing.T, path string) {
			statefiletest.Write(t, path, map[string]map[string][]byte{
				statefile.BucketMeta:    {statefile.KeyFormat: u64(statefile.FormatVersion + 1), statefile.KeyEpoch: []byte("e"), statefile.KeyRevision: u64(3)},
				statefile.BucketObjects: {id: value},
			})
		}, "format version 2, want 1"},
		{"object beyond the revision", func(t *testing.T, path string) {
			statefiletest.Write(t, path, map[string]map[string][]byte{
				statefile.BucketMeta:    {statefile.KeyEpoch: []byte("e"), statefile.KeyRevision: u64(2)},
				statefile.BucketObjects: {id: value},
			})
		}, "revision 3 is beyond the store's revision 2"},
		{"objects without an epoch", func(t *testing.T, path string) {
			statefiletest.Write(t, path, map[string]map[string][]byte{
				statefile.BucketMeta:    {statefile.KeyRevision: u64(3)},
				statefile.BucketObjects: {id: value},
			})
		}, "the epoch is missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, DBFileName)
			tt.write(t, path)
			srv, err := New(Options{DataDir: dir, Logger: slog.New(slog.DiscardHandler)})
			if err == nil {
				srv.Close()
				t.Fatal("New on a bad store file succeeded")
			}
			if !errors.Is(err, ErrCorrupt) || errors.Is(err, ErrLocked) {
				t.Errorf("New error = %v, want ErrCorrupt", err)
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New error = %q, want it to name %s and say %q", err, path, tt.want)
			}
		})
	}
}

// TestLoadsStoreWithoutFormatVersion checks that a store file of the layout nimbus wrote
// before it stored the format version loads, and keeps loading once this version has
// written to it.
func TestLoadsStoreWithoutFormatVersion(t *testing.T) {
	dir := t.TempDir()
	id, value := storedRoute(t, "r1", 3)
	statefiletest.Write(t, filepath.Join(dir, DBFileName), map[string]map[string][]byte{
		statefile.BucketMeta:    {statefile.KeyEpoch: []byte("old-epoch"), statefile.KeyRevision: u64(3)},
		statefile.BucketObjects: {id: value},
	})
	ts := start(t, Options{DataDir: dir})
	if got := ts.srv.Epoch(); got != "old-epoch" {
		t.Errorf("epoch = %q, want old-epoch", got)
	}
	if got := ts.get(t, routeKey("r1")).GetObject().GetMeta().GetRevision(); got != 3 {
		t.Errorf("r1 at revision %d, want 3", got)
	}
	ts.apply(t, route("r2", nil, "192.0.2.1"))
	ts.srv.Close()
	// The file now carries the format version: an open that insists on one reads it.
	f, _, err := statefile.Open(filepath.Join(dir, DBFileName), statefile.Options{})
	if err != nil {
		t.Fatalf("strict open after nimbus wrote to the file: %v", err)
	}
	f.Close()

	again := start(t, Options{DataDir: dir})
	list, err := again.client.List(testContext(t), &nimbusv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetItems()) != 2 || list.GetRevision() != 4 || again.srv.Epoch() != "old-epoch" {
		t.Errorf("after a restart: %d objects at revision %d epoch %q, want 2 at 4 epoch old-epoch", len(list.GetItems()), list.GetRevision(), again.srv.Epoch())
	}
}

func TestOpenDiskRefusesLockedStore(t *testing.T) {
	dir := t.TempDir()
	ts := start(t, Options{DataDir: dir})
	// A nanosecond tries the lock once instead of waiting for it.
	d, _, err := openDisk(dir, time.Nanosecond, newEpoch)
	if err == nil {
		d.close()
		t.Fatal("a second open of a store in use succeeded")
	}
	path := filepath.Join(dir, DBFileName)
	if !errors.Is(err, ErrLocked) || errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), path) {
		t.Errorf("open of a store in use: err = %v, want ErrLocked naming %s", err, path)
	}
	// The server holding the file is unharmed.
	ts.apply(t, route("r1", nil, "192.0.2.1"))
}

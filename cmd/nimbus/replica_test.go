package main

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/naplesnet/naples/internal/testetcd"
	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func TestParseStoreFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		// wantErr is part of what stderr must say; empty for no error.
		wantErr string
	}{
		{name: "etcd", args: []string{"--store", "etcd", "--etcd-endpoints", "https://e1:2379,unix:///run/etcd.sock", "--advertise", "tcp://n1:7000"}},
		{name: "unknown store", args: []string{"--store", "zookeeper"}, wantErr: `store "zookeeper": want embedded or etcd`},
		{name: "etcd without endpoints", args: []string{"--store", "etcd"}, wantErr: "--store etcd needs --etcd-endpoints"},
		{name: "bad endpoint", args: []string{"--store", "etcd", "--etcd-endpoints", "e1:2379"}, wantErr: `endpoint "e1:2379": want`},
		{name: "etcd and data dir", args: []string{"--store", "etcd", "--etcd-endpoints", "http://e:1", "--data-dir", "/x"}, wantErr: "--data-dir and --ephemeral do not apply"},
		{name: "endpoints without etcd", args: []string{"--etcd-endpoints", "http://e:1"}, wantErr: "need --store etcd"},
		{name: "cert without key", args: []string{"--store", "etcd", "--etcd-endpoints", "http://e:1", "--etcd-cert", "c.pem"}, wantErr: "go together"},
		{name: "negative compaction interval", args: []string{"--store", "etcd", "--etcd-endpoints", "http://e:1", "--etcd-compaction-interval", "-1s"}, wantErr: "--etcd-compaction-interval -1s: must not be negative"},
		{name: "negative compaction retention", args: []string{"--store", "etcd", "--etcd-endpoints", "http://e:1", "--etcd-compaction-retention", "-1"}, wantErr: "--etcd-compaction-retention -1: must not be negative"},
		{name: "negative progress timeout", args: []string{"--store", "etcd", "--etcd-endpoints", "http://e:1", "--etcd-progress-timeout", "-1s"}, wantErr: "--etcd-progress-timeout -1s: must not be negative"},
		{name: "negative rebalance rate", args: []string{"--store", "etcd", "--etcd-endpoints", "http://e:1", "--rebalance-rate", "-1"}, wantErr: "--rebalance-rate -1: want a finite number, 0 or more"},
		{name: "rebalance rate not a number", args: []string{"--store", "etcd", "--etcd-endpoints", "http://e:1", "--rebalance-rate", "NaN"}, wantErr: "--rebalance-rate NaN: want a finite number"},
		{name: "negative rebalance slack", args: []string{"--store", "etcd", "--etcd-endpoints", "http://e:1", "--rebalance-slack", "-1"}, wantErr: "--rebalance-slack -1: must not be negative"},
		{name: "bad advertise", args: []string{"--store", "etcd", "--etcd-endpoints", "http://e:1", "--advertise", "ftp://n1:7000"}, wantErr: `"ftp://n1:7000"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			cfg, err := parseFlags(tc.args, &stderr, noEnv)
			if tc.wantErr != "" {
				if !errors.Is(err, errUsage) || !strings.Contains(stderr.String(), tc.wantErr) {
					t.Fatalf("parseFlags(%q) = %v with output %q, want a usage error saying %q", tc.args, err, stderr.String(), tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseFlags(%q): %v", tc.args, err)
			}
			if cfg.dataDir != "" || cfg.replica.store != "etcd" || len(cfg.replica.endpoints) != 2 {
				t.Fatalf("parseFlags(%q) = data dir %q store %q endpoints %q", tc.args, cfg.dataDir, cfg.replica.store, cfg.replica.endpoints)
			}
			if want := (nimbus.RebalanceOptions{Rate: nimbus.DefaultRebalanceRate, Slack: nimbus.DefaultRebalanceSlack}); cfg.replica.rebalance != want {
				t.Fatalf("parseFlags(%q): rebalancing %+v, want the defaults %+v", tc.args, cfg.replica.rebalance, want)
			}
			// Flags at 0 turn compaction and the progress timeout off: the options' negative.
			// The retention is left to the store, which takes the history window's.
			cfg.replica.compactionInterval, cfg.replica.progressTimeout = 0, 0
			eo, err := cfg.replica.etcdOptions(nil)
			if err != nil || eo.CompactionInterval >= 0 || eo.ProgressTimeout >= 0 || eo.CompactionRetention != 0 {
				t.Fatalf("etcd options with compaction and the progress timeout off: %+v, %v", eo, err)
			}
		})
	}
}

func TestRunOnEtcd(t *testing.T) {
	c := testetcd.Start(t, 1)
	sock := filepath.Join(t.TempDir(), "n.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "unix://" + sock, "--insecure", "--store", "etcd",
			"--etcd-endpoints", strings.Join(c.Endpoints(), ","), "--replica-name", "r1"}, &stderr)
	}()
	applyWhenReady(t, sock, &stderr)
	callCtx, callCancel := context.WithTimeout(ctx, 20*time.Second)
	defer callCancel()
	kv, err := c.Client(t).Get(callCtx, "/naples/objects/Node/default/default/n1")
	if err != nil || len(kv.Kvs) != 1 {
		t.Fatalf("etcd holds %v (err %v), want the applied Node under /naples/objects/", kv, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run = %v", err)
	}
	if !strings.Contains(stderr.String(), "store is etcd") {
		t.Errorf("log does not say the store is etcd:\n%s", stderr.String())
	}
}

// applyWhenReady applies a Node object n1 through the replica serving on the socket, again
// until the replica, which refuses calls until it has read etcd, takes it; it fails the
// test with the replica's log after 30s.
func applyWhenReady(t *testing.T, sock string, log *bytes.Buffer) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := nimbusv1.NewNimbusClient(conn)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	obj := &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: "n1"},
		Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{Hostname: "n1", VtepAddress: "192.0.2.1"}},
	}
	for {
		_, err = api.Apply(ctx, &nimbusv1.ApplyRequest{Object: obj}, grpc.WaitForReady(true))
		if err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("Apply through the replica: %v; log:\n%s", err, log.String())
	}
}

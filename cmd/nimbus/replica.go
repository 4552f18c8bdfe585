package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/internal/cmdline"
	"github.com/naplesnet/naples/nimbus"
)

// replicaConfig is what the command line says about the store: embedded, or etcd with
// nimbus one replica of several.
type replicaConfig struct {
	// store is "embedded" or "etcd".
	store string
	// endpoints are etcd's client URLs.
	endpoints []string
	// etcdCA, etcdCert and etcdKey are the files of the TLS options of the etcd client.
	etcdCA, etcdCert, etcdKey string
	// prefix is the key prefix in etcd.
	prefix string
	// maxTxnOps bounds the changes of one etcd transaction.
	maxTxnOps int
	// compactionInterval is how often the replica compacts etcd, 0 never;
	// compactionRetention how many etcd revisions a compaction keeps, 0 as many as the
	// history window keeps changes.
	compactionInterval  time.Duration
	compactionRetention int64
	// progressTimeout is how long the etcd watch may hear nothing before the replica
	// counts as cut off, 0 never.
	progressTimeout time.Duration
	// name is the replica's name among the replicas; advertise where they reach it.
	name      string
	advertise string
	// rebalance is how a replica that holds more than its share of the agents asks some
	// to move.
	rebalance nimbus.RebalanceOptions
}

// addReplicaFlags defines the flags of the store and of replicas on fs.
func addReplicaFlags(fs *cmdline.FlagSet, rc *replicaConfig) {
	hostname, _ := os.Hostname()
	rc.store, rc.name, rc.prefix = "embedded", hostname, nimbus.DefaultEtcdPrefix
	rc.rebalance = nimbus.RebalanceOptions{Rate: nimbus.DefaultRebalanceRate, Slack: nimbus.DefaultRebalanceSlack}
	fs.Func("store", "`kind` of store: embedded (objects in --data-dir, one nimbus) or etcd (objects in etcd, any number of replicas) (default embedded)", func(s string) error {
		switch s {
		case "embedded", "etcd":
			rc.store = s
			return nil
		}
		return fmt.Errorf("store %q: want embedded or etcd", s)
	})
	fs.Func("etcd-endpoints", "etcd's client `URLs`, comma-separated (with --store etcd)", func(s string) error {
		for _, ep := range strings.Split(s, ",") {
			ep = strings.TrimSpace(ep)
			if !strings.HasPrefix(ep, "http://") && !strings.HasPrefix(ep, "https://") && !strings.HasPrefix(ep, "unix://") && !strings.HasPrefix(ep, "unixs://") {
				return fmt.Errorf("endpoint %q: want http://host:port, https://host:port or unix://path", ep)
			}
			rc.endpoints = append(rc.endpoints, ep)
		}
		return nil
	})
	fs.StringVar(&rc.etcdCA, "etcd-cacert", "", "`file` of the CA certificates that verify etcd's server certificates")
	fs.StringVar(&rc.etcdCert, "etcd-cert", "", "`file` of the client certificate nimbus presents to etcd")
	fs.StringVar(&rc.etcdKey, "etcd-key", "", "`file` of the private key of --etcd-cert")
	fs.StringVar(&rc.prefix, "etcd-prefix", nimbus.DefaultEtcdPrefix, "key `prefix` of everything nimbus keeps in etcd; replicas of one nimbus share it")
	fs.IntVar(&rc.maxTxnOps, "etcd-max-txn-ops", nimbus.DefaultEtcdMaxTxnOps, "most object `changes` per etcd transaction, at most etcd's --max-txn-ops (checked at start: nimbus exits when etcd refuses it); larger batches are split")
	fs.DurationVar(&rc.compactionInterval, "etcd-compaction-interval", nimbus.DefaultEtcdCompactionInterval,
		"how often the replica compacts etcd's history (all of etcd's keys), keeping what it saw one `interval` ago; 0: never (leave it to etcd's --auto-compaction-retention)")
	fs.Int64Var(&rc.compactionRetention, "etcd-compaction-retention", 0,
		"how many of the latest etcd `revisions` a compaction keeps, no less than --history-window (default: as --history-window)")
	fs.DurationVar(&rc.progressTimeout, "etcd-progress-timeout", nimbus.DefaultEtcdProgressTimeout,
		"how long the replica's etcd watch may hear nothing (it asks for progress every quarter of it) before the replica is cut off from etcd and not ready, so that agents move; 0: never")
	fs.StringVar(&rc.name, "replica-name", rc.name, "this replica's `name` among the replicas, which its certificate names; the host name when not given")
	fs.Func("advertise", "`address` the other replicas reach this one at, unix:///path or tcp://host:port (with --store etcd; default the first --listen)", func(s string) error {
		if _, err := address.Parse(s); err != nil {
			return err
		}
		rc.advertise = s
		return nil
	})
	fs.Float64Var(&rc.rebalance.Rate, "rebalance-rate", rc.rebalance.Rate,
		"`agents` a second, on average, a replica that holds more than its share of the agents asks at most to watch another replica, where they resume (with --store etcd); 0: never")
	fs.IntVar(&rc.rebalance.Slack, "rebalance-slack", rc.rebalance.Slack,
		"how many `agents` above its share (the agents over the replicas, rounded up) a replica may hold before it asks any to move")
}

// check checks the store flags together with the others.
func (rc *replicaConfig) check(dataDirSet, ephemeral bool) error {
	if rc.store != "etcd" {
		if len(rc.endpoints) > 0 || rc.advertise != "" {
			return errors.New("--etcd-endpoints and --advertise need --store etcd")
		}
		return nil
	}
	switch {
	case len(rc.endpoints) == 0:
		return errors.New("--store etcd needs --etcd-endpoints")
	case dataDirSet || ephemeral:
		return errors.New("--store etcd keeps objects in etcd: --data-dir and --ephemeral do not apply")
	case rc.name == "":
		return errors.New("--replica-name is empty and the hostname is unknown")
	case (rc.etcdCert == "") != (rc.etcdKey == ""):
		return errors.New("--etcd-cert and --etcd-key go together")
	case rc.compactionInterval < 0:
		return fmt.Errorf("--etcd-compaction-interval %v: must not be negative", rc.compactionInterval)
	case rc.progressTimeout < 0:
		return fmt.Errorf("--etcd-progress-timeout %v: must not be negative", rc.progressTimeout)
	case rc.compactionRetention < 0:
		return fmt.Errorf("--etcd-compaction-retention %d: must not be negative", rc.compactionRetention)
	case !(rc.rebalance.Rate >= 0) || math.IsInf(rc.rebalance.Rate, 1):
		return fmt.Errorf("--rebalance-rate %v: want a finite number, 0 or more", rc.rebalance.Rate)
	case rc.rebalance.Slack < 0:
		return fmt.Errorf("--rebalance-slack %d: must not be negative", rc.rebalance.Slack)
	}
	return nil
}

// etcdOptions returns the options of the etcd store; the replica is reached at the first
// listen address unless --advertise says otherwise.
func (rc *replicaConfig) etcdOptions(listen []address.Address) (*nimbus.EtcdOptions, error) {
	cfg := clientv3.Config{Endpoints: rc.endpoints}
	if rc.etcdCA != "" || rc.etcdCert != "" {
		info := transport.TLSInfo{TrustedCAFile: rc.etcdCA, CertFile: rc.etcdCert, KeyFile: rc.etcdKey}
		tlsCfg, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd TLS options (--etcd-cacert %q, --etcd-cert %q, --etcd-key %q): %w", rc.etcdCA, rc.etcdCert, rc.etcdKey, err)
		}
		cfg.TLS = tlsCfg
	}
	advertise := rc.advertise
	if advertise == "" && len(listen) > 0 {
		advertise = listen[0].String()
	}
	// The options' "never" is negative.
	interval, progress := rc.compactionInterval, rc.progressTimeout
	if interval == 0 {
		interval = -1
	}
	if progress == 0 {
		progress = -1
	}
	return &nimbus.EtcdOptions{Config: cfg, Prefix: rc.prefix, MaxTxnOps: rc.maxTxnOps, Advertise: advertise,
		CompactionInterval: interval, CompactionRetention: rc.compactionRetention, ProgressTimeout: progress}, nil
}

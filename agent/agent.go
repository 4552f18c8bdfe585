package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/nimbusclient"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Config is what one agent needs to run.
type Config struct {
	// Node is this host's node name. Required.
	Node string
	// Nimbus is nimbus's address, "unix:///path" or "tcp://host:port". Required.
	Nimbus string
	// StateDir holds the agent's state; one agent at a time may use it. Required.
	StateDir string
	// Logger receives every log. Default: slog.Default().
	Logger *slog.Logger

	// netns, when set, is the network namespace the HAL programs instead of the
	// agent's own; tests use it to keep their hands off the machine's namespace.
	netns *netns.NsHandle
}

// Run runs the agent until ctx ends, then stops every part and returns nil. It returns an
// error when the agent cannot start or a part fails.
func Run(ctx context.Context, cfg Config) error {
	if err := nimbusv1.ValidateNodeName(cfg.Node); err != nil {
		return fmt.Errorf("agent: --node: %w", err)
	}
	if cfg.StateDir == "" {
		return errors.New("agent: state directory is required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("node", cfg.Node)
	unlock, err := lockStateDir(cfg.StateDir)
	if err != nil {
		return err
	}
	defer unlock()

	store, err := delphi.Open(delphi.Options{Logger: log})
	if err != nil {
		return err
	}
	defer store.Close()
	client, err := nimbusclient.New(nimbusclient.Options{Node: cfg.Node, Address: cfg.Nimbus, Store: store, Logger: log})
	if err != nil {
		return err
	}
	reconcilers, closeBackend, err := backend(store, cfg.netns, log)
	if err != nil {
		return err
	}
	defer closeBackend()
	h, err := hal.New(hal.Options{Store: store, Reconcilers: reconcilers, Logger: log})
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for name, run := range map[string]func(context.Context) error{"nimbus client": client.Run, "hal": h.Run} {
		wg.Go(func() {
			if err := run(ctx); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		})
	}
	log.Info("agent started", "nimbus", cfg.Nimbus, "state_dir", cfg.StateDir)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	log.Info("agent stopped")
	return nil
}

// lockStateDir creates the state directory and takes an exclusive lock on it, so two
// agents never share one host's state.
func lockStateDir(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state directory: %w", err)
	}
	path := filepath.Join(dir, "agent.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock file: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s (is another agent running on this state directory?): %w", path, err)
	}
	return func() { f.Close() }, nil
}

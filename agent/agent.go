package agent

import (
	"context"
	"crypto/tls"
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
	// TLS is the TLS configuration the agent dials nimbus with, presenting this node's
	// certificate, which must name Node. Default: nil, which dials plaintext.
	TLS *tls.Config
	// StateDir holds the agent's state; one agent at a time may use it. Delphi keeps the
	// desired objects and the nimbus resume point there, so a restarted agent enforces
	// them before nimbus is reachable. Required.
	StateDir string
	// DiscardState throws away the stored desired state at start, so the agent starts
	// empty and resyncs from nimbus; it is the way out of a corrupt state file.
	// Default: false.
	DiscardState bool
	// Logger receives every log. Default: slog.Default().
	Logger *slog.Logger
	// Socket is the path of the unix socket the agent serves its read-only local API on
	// (delphi.v1.Delphi); its directory is created and the socket is made mode 0660.
	// Default: empty, the API is not served.
	Socket string

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

	// Delphi restores the stored desired state before the nimbus client starts.
	store, err := delphi.Open(delphi.Options{Dir: cfg.StateDir, Discard: cfg.DiscardState, Indexes: indexes(), Logger: log})
	if errors.Is(err, delphi.ErrCorrupt) {
		return fmt.Errorf("agent: %w (start with --discard-state to discard it and resync from nimbus)", err)
	}
	if err != nil {
		return fmt.Errorf("agent: opening delphi: %w", err)
	}
	defer store.Close()
	client, err := nimbusclient.New(nimbusclient.Options{Node: cfg.Node, Address: cfg.Nimbus, TLS: cfg.TLS, Store: store, Logger: log})
	if err != nil {
		return err
	}
	reconcilers, closeBackend, err := backend(store, cfg.netns, log)
	if err != nil {
		return err
	}
	defer closeBackend()
	halStore, err := hal.Delphi(store)
	if err != nil {
		return err
	}
	h, err := hal.New(hal.Options{Store: halStore, Reconcilers: reconcilers, Logger: log})
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	parts := map[string]func(context.Context) error{"nimbus client": client.Run, "hal": h.Run}
	if cfg.Socket != "" {
		serve, err := serveLocalAPI(ctx, cfg.Socket, store, log)
		if err != nil {
			return err
		}
		parts["local api"] = serve
	}
	errs := make(chan error, len(parts))
	for name, run := range parts {
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

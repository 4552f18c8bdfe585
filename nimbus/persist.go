package nimbus

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/naplesnet/naples/internal/statefile"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

const (
	// DBFileName is the name of the durable store's file in Options.DataDir. Its layout
	// is internal/statefile's: the objects under their key IDs, the epoch and the revision.
	DBFileName = "nimbus.db"

	// diskLockTimeout is how long opening the file waits for another process to let go of it.
	diskLockTimeout = 5 * time.Second
)

// disk is the durable copy of the objects, the revision and the epoch, in a state file.
// Statuses and the watching nodes are not kept: they come back when the agents reconnect.
type disk struct {
	file  *statefile.File
	path  string
	epoch string
}

// diskState is what a durable store holds.
type diskState struct {
	epoch   string
	rev     uint64
	objects []*nimbusv1.Object
}

// openDisk opens, or creates, the store file in dir, waiting lockTimeout for another
// process to let go of it, and reads it. A file that holds nothing yet, as a new one,
// is given the epoch newEpoch returns. A file nimbus cannot use fails with an error that
// wraps ErrCorrupt, or ErrLocked, and names it. Files written before the format version
// was stored, which have none, are taken for version 1, the layout they have.
func openDisk(dir string, lockTimeout time.Duration, newEpoch func() string) (*disk, *diskState, error) {
	path := filepath.Join(dir, DBFileName)
	f, c, err := statefile.Open(path, statefile.Options{
		LockTimeout:       lockTimeout,
		AcceptUnversioned: true,
		Corrupt:           ErrCorrupt,
		Locked:            ErrLocked,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("opening nimbus store: %w", err)
	}
	d := &disk{file: f, path: path, epoch: c.Epoch}
	if err := d.check(c); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("opening nimbus store: %w", err)
	}
	if d.epoch == "" {
		d.epoch = newEpoch()
		if err := f.Commit(statefile.Batch{Position: &statefile.Position{Epoch: d.epoch}}); err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("initializing nimbus store: %w", err)
		}
	}
	return d, &diskState{epoch: d.epoch, rev: c.Revision, objects: c.Objects}, nil
}

// check refuses contents nimbus cannot carry on from: objects or a revision without an
// epoch, and an object whose revision is beyond the store's.
func (d *disk) check(c *statefile.Contents) error {
	if c.Epoch == "" && (c.Revision != 0 || len(c.Objects) > 0) {
		return fmt.Errorf("%s: %w: the epoch is missing", d.path, ErrCorrupt)
	}
	for _, obj := range c.Objects {
		if r := obj.GetMeta().GetRevision(); r > c.Revision {
			return fmt.Errorf("%s: %w: object %q: revision %d is beyond the store's revision %d",
				d.path, ErrCorrupt, obj.Key().ID(), r, c.Revision)
		}
	}
	return nil
}

// commit durably stores the changes of revisions from to to in one state-file commit,
// one fsync when small (statefile.File.Commit): the objects of puts under their key IDs, the deletion of the key IDs of dels,
// and to as the revision. A key ID is in puts or dels once at most.
func (d *disk) commit(puts []*nimbusv1.Object, dels []string, from, to uint64) error {
	b := statefile.Batch{Put: puts, Delete: dels, Position: &statefile.Position{Epoch: d.epoch, Revision: to}}
	if err := d.file.Commit(b); err != nil {
		if from == to {
			return fmt.Errorf("storing revision %d: %w", to, err)
		}
		return fmt.Errorf("storing revisions %d to %d: %w", from, to, err)
	}
	return nil
}

// close closes the file. It is safe to call twice.
func (d *disk) close() error {
	return d.file.Close()
}

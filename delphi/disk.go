package delphi

import (
	"fmt"
	"time"

	"github.com/naplesnet/naples/internal/statefile"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// StateFile is the name of the state file a store with Options.Dir keeps in that directory.
// Its layout is internal/statefile's: the desired objects under their key IDs, and the
// resume point as the file's epoch and revision.
const StateFile = "delphi.db"

// lockTimeout is how long Open waits for the state file's lock before it gives up with
// ErrLocked.
const lockTimeout = time.Second

// fileOptions are the options delphi opens and discards its state file with. The file
// must carry its format version: delphi has always written it.
var fileOptions = statefile.Options{LockTimeout: lockTimeout, Corrupt: ErrCorrupt, Locked: ErrLocked}

// disk is the durable copy of the desired table and the resume point.
type disk struct {
	file *statefile.File
	path string
}

// restored is what a state file held when the store was opened.
type restored struct {
	objects  []*nimbusv1.Object
	resume   *statefile.Position
	fromFile bool
}

// openDisk opens the state file at path, creating it when absent, and reads what it holds.
// With discard, an existing file is removed first.
func openDisk(path string, discard bool) (*disk, *restored, error) {
	if discard {
		if err := statefile.Remove(path, fileOptions); err != nil {
			return nil, nil, fmt.Errorf("discarding stored state: %w", err)
		}
	}
	f, c, err := statefile.Open(path, fileOptions)
	if err != nil {
		return nil, nil, err
	}
	r := &restored{objects: c.Objects, fromFile: !c.Created}
	if c.Epoch != "" || c.Revision != 0 {
		r.resume = &c.Position
	}
	return &disk{file: f, path: path}, r, nil
}

// commit writes what a write transaction of the desired table changed, its changes, and
// its resume point, in one file transaction: after it returns nil they are on disk; after
// an error, or a crash, none are. The file keeps objects under their key IDs.
func (d *disk) commit(w *desiredWrite, changes []desiredChange) error {
	var b statefile.Batch
	for _, c := range changes {
		if c.after != nil {
			b.Put = append(b.Put, c.obj)
		} else {
			b.Delete = append(b.Delete, c.key.String())
		}
	}
	if w.resume {
		b.Position = &statefile.Position{Epoch: w.st.epoch, Revision: w.st.revision}
	}
	return d.file.Commit(b)
}

// release takes the state file's pages out of the process's resident set: restoring read
// every page, and a commit reads only the few it changes (statefile.File.ReleasePages).
// It is best effort: an RSS that stays high is all that can go wrong.
func (d *disk) release() error {
	return d.file.ReleasePages()
}

// close closes the file. It is safe to call twice.
func (d *disk) close() error {
	return d.file.Close()
}

package delphi

import (
	"fmt"
	"time"

	"github.com/hashicorp/go-memdb"

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
}

// restored is what a state file held when the store was opened.
type restored struct {
	objects  []*nimbusv1.Object
	resume   *resumeRecord
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
		r.resume = &resumeRecord{ID: tableResume, Epoch: c.Epoch, Revision: c.Revision}
	}
	return &disk{file: f}, r, nil
}

// persistent reports whether a memdb transaction's changes touch what the file keeps.
func persistent(changes memdb.Changes) bool {
	for _, c := range changes {
		if c.Table == string(TableDesired) || c.Table == tableResume {
			return true
		}
	}
	return false
}

// commit writes the desired-table and resume changes of one memdb transaction in one file
// transaction: after it returns nil they are on disk; after an error, or a crash, none are.
func (d *disk) commit(changes memdb.Changes) error {
	var b statefile.Batch
	for _, c := range changes {
		switch c.Table {
		case string(TableDesired):
			switch {
			case c.After != nil:
				b.Put = append(b.Put, c.After.(*desiredRecord).Object)
			case c.Before != nil:
				b.Delete = append(b.Delete, c.Before.(*desiredRecord).ID)
			}
			// Neither: created and deleted within the transaction.
		case tableResume:
			r := c.After.(*resumeRecord)
			b.Position = &statefile.Position{Epoch: r.Epoch, Revision: r.Revision}
		}
	}
	return d.file.Commit(b)
}

// close closes the file. It is safe to call twice.
func (d *disk) close() error {
	return d.file.Close()
}

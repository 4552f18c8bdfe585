package delphi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-memdb"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// StateFile is the name of the state file a store with Options.Dir keeps in that directory.
const StateFile = "delphi.db"

// formatVersion is the layout of the state file that this code writes and reads: bucket
// "objects" maps key IDs to serialized nimbusv1.Object, bucket "meta" holds "format",
// "epoch" and "revision".
const formatVersion = 1

// lockTimeout is how long Open waits for the state file's lock before it gives up with
// ErrLocked.
const lockTimeout = time.Second

var (
	bucketObjects = []byte("objects")
	bucketMeta    = []byte("meta")
	keyFormat     = []byte("format")
	keyEpoch      = []byte("epoch")
	keyRevision   = []byte("revision")
)

// disk is the durable copy of the desired table and the resume point, in a bbolt file.
type disk struct {
	db   *bolt.DB
	path string
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
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, nil, fmt.Errorf("creating state directory: %w", err)
	}
	if discard {
		if err := discardFile(path); err != nil {
			return nil, nil, err
		}
	}
	_, statErr := os.Stat(path)
	existed := statErr == nil
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout})
	if err != nil {
		return nil, nil, openError(path, err)
	}
	d := &disk{db: db, path: path}
	r, err := d.load()
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	r.fromFile = existed
	return d, r, nil
}

// discardFile removes the state file at path, unless another process holds it open.
func discardFile(path string) error {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	// Opening takes the file's lock before it reads anything, so a timeout means another
	// process has the file open, and any other outcome means nobody has.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return fmt.Errorf("discarding %s: %w", path, ErrLocked)
	}
	if err == nil {
		db.Close()
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("discarding state file: %w", err)
	}
	return nil
}

// openError classifies an error of bolt.Open: a held lock is ErrLocked, a file that cannot
// be opened at all is reported as such, and anything bbolt finds wrong with the file's
// content is ErrCorrupt.
func openError(path string, err error) error {
	if errors.Is(err, bolterrors.ErrTimeout) {
		return fmt.Errorf("opening %s: %w", path, ErrLocked)
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Op == "open" {
		return fmt.Errorf("opening state file: %w", err)
	}
	return corrupt(path, err)
}

// corrupt returns an error that wraps ErrCorrupt and cause and names the file.
func corrupt(path string, cause error) error {
	return fmt.Errorf("%s: %w: %w", path, ErrCorrupt, cause)
}

// load reads every object and the resume point, checking that each value parses and is
// stored under its own key. A file without buckets is new: load creates them.
func (d *disk) load() (r *restored, err error) {
	defer func() {
		// bbolt panics on some kinds of damaged pages; that is a corrupt file too.
		if p := recover(); p != nil {
			r, err = nil, corrupt(d.path, fmt.Errorf("reading: %v", p))
		}
	}()
	r = &restored{}
	fresh := false
	err = d.db.View(func(tx *bolt.Tx) error {
		objs, meta := tx.Bucket(bucketObjects), tx.Bucket(bucketMeta)
		if objs == nil && meta == nil {
			fresh = true
			return nil
		}
		if objs == nil || meta == nil {
			return errors.New("a bucket is missing")
		}
		format, err := readUint(meta, keyFormat)
		if err != nil {
			return err
		}
		if format != formatVersion {
			return fmt.Errorf("format version %d, want %d", format, formatVersion)
		}
		rev, err := readUint(meta, keyRevision)
		if err != nil {
			return err
		}
		if epoch := meta.Get(keyEpoch); epoch != nil || rev != 0 {
			r.resume = &resumeRecord{ID: tableResume, Epoch: string(epoch), Revision: rev}
		}
		return objs.ForEach(func(k, v []byte) error {
			obj := &nimbusv1.Object{}
			if err := proto.Unmarshal(v, obj); err != nil {
				return fmt.Errorf("object %q: %w", k, err)
			}
			if id := obj.Key().ID(); id != string(k) {
				return fmt.Errorf("object %q holds %s", k, id)
			}
			r.objects = append(r.objects, obj)
			return nil
		})
	})
	if err != nil {
		return nil, corrupt(d.path, err)
	}
	if fresh {
		err := d.db.Update(func(tx *bolt.Tx) error {
			if _, err := tx.CreateBucket(bucketObjects); err != nil {
				return err
			}
			meta, err := tx.CreateBucket(bucketMeta)
			if err != nil {
				return err
			}
			return meta.Put(keyFormat, binary.BigEndian.AppendUint64(nil, formatVersion))
		})
		if err != nil {
			return nil, fmt.Errorf("initializing %s: %w", d.path, err)
		}
	}
	return r, nil
}

// readUint reads an 8-byte big-endian value; a missing one is 0.
func readUint(b *bolt.Bucket, key []byte) (uint64, error) {
	v := b.Get(key)
	if v == nil {
		return 0, nil
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("meta %q: %d bytes, want 8", key, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
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

// commit writes the desired-table and resume changes of one memdb transaction in one bbolt
// transaction: after it returns nil they are on disk; after an error, or a crash, none are.
func (d *disk) commit(changes memdb.Changes) error {
	return d.db.Update(func(tx *bolt.Tx) error {
		objs, meta := tx.Bucket(bucketObjects), tx.Bucket(bucketMeta)
		for _, c := range changes {
			switch c.Table {
			case string(TableDesired):
				if c.After == nil {
					if c.Before == nil {
						continue // created and deleted within the transaction
					}
					id := c.Before.(*desiredRecord).ID
					if err := objs.Delete([]byte(id)); err != nil {
						return fmt.Errorf("deleting %s: %w", id, err)
					}
					continue
				}
				rec := c.After.(*desiredRecord)
				v, err := proto.Marshal(rec.Object)
				if err != nil {
					return fmt.Errorf("encoding %s: %w", rec.ID, err)
				}
				if err := objs.Put([]byte(rec.ID), v); err != nil {
					return fmt.Errorf("writing %s: %w", rec.ID, err)
				}
			case tableResume:
				r := c.After.(*resumeRecord)
				if err := meta.Put(keyEpoch, []byte(r.Epoch)); err != nil {
					return fmt.Errorf("writing resume epoch: %w", err)
				}
				if err := meta.Put(keyRevision, binary.BigEndian.AppendUint64(nil, r.Revision)); err != nil {
					return fmt.Errorf("writing resume revision: %w", err)
				}
			}
		}
		return nil
	})
}

// close closes the file. It is safe to call twice.
func (d *disk) close() error {
	if err := d.db.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", d.path, err)
	}
	return nil
}

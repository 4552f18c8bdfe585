package nimbus

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The layout of the durable store: the meta bucket holds the epoch and the revision, the
// objects bucket every object in wire form under its key ID.
const (
	// DBFileName is the name of the durable store's file in Options.DataDir.
	DBFileName = "nimbus.db"

	// diskLockTimeout is how long opening the file waits for another process to let go of it.
	diskLockTimeout = 5 * time.Second
)

var (
	bucketMeta    = []byte("meta")
	bucketObjects = []byte("objects")
	keyEpoch      = []byte("epoch")
	keyRevision   = []byte("revision")
)

// disk is the durable copy of the objects, the revision and the epoch, in a bbolt file.
// Statuses and the watching nodes are not kept: they come back when the agents reconnect.
type disk struct {
	path string
	db   *bolt.DB
}

// diskState is what a durable store holds.
type diskState struct {
	epoch   string
	rev     uint64
	objects []*nimbusv1.Object
}

// openDisk opens, or creates, the store file in dir and reads it. A new file is given the
// epoch newEpoch returns.
func openDisk(dir string, newEpoch func() string) (*disk, *diskState, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("creating data directory: %w", err)
	}
	path := filepath.Join(dir, DBFileName)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: diskLockTimeout})
	if err != nil {
		return nil, nil, fmt.Errorf("opening nimbus store %s: %w", path, err)
	}
	d := &disk{path: path, db: db}
	st, err := d.load(newEpoch)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return d, st, nil
}

// load reads the epoch, the revision and every object, after giving a new file its epoch,
// revision 0 and no objects.
func (d *disk) load(newEpoch func() string) (*diskState, error) {
	err := d.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketMeta) != nil {
			return nil
		}
		meta, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return err
		}
		if _, err := tx.CreateBucket(bucketObjects); err != nil {
			return err
		}
		if err := meta.Put(keyEpoch, []byte(newEpoch())); err != nil {
			return err
		}
		return meta.Put(keyRevision, binary.BigEndian.AppendUint64(nil, 0))
	})
	if err != nil {
		return nil, fmt.Errorf("initializing nimbus store %s: %w", d.path, err)
	}
	st := &diskState{}
	err = d.db.View(func(tx *bolt.Tx) error {
		meta, objects := tx.Bucket(bucketMeta), tx.Bucket(bucketObjects)
		if objects == nil {
			return fmt.Errorf("bucket %q is missing", bucketObjects)
		}
		st.epoch = string(meta.Get(keyEpoch))
		if st.epoch == "" {
			return fmt.Errorf("the epoch is missing")
		}
		rev := meta.Get(keyRevision)
		if len(rev) != 8 {
			return fmt.Errorf("revision %x: want 8 bytes", rev)
		}
		st.rev = binary.BigEndian.Uint64(rev)
		return objects.ForEach(func(k, v []byte) error {
			obj := &nimbusv1.Object{}
			if err := proto.Unmarshal(v, obj); err != nil {
				return fmt.Errorf("object %q: %w", k, err)
			}
			if id := obj.Key().ID(); id != string(k) {
				return fmt.Errorf("object %q: stored under the key of %s", k, id)
			}
			if r := obj.GetMeta().GetRevision(); r > st.rev {
				return fmt.Errorf("object %q: revision %d is beyond the store's revision %d", k, r, st.rev)
			}
			st.objects = append(st.objects, obj)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("reading nimbus store %s: %w", d.path, err)
	}
	return st, nil
}

// commit durably stores the change of revision rev: obj under the key ID, or the deletion
// of the key ID when obj is nil, together with the revision.
func (d *disk) commit(id string, obj *nimbusv1.Object, rev uint64) error {
	var b []byte
	if obj != nil {
		var err error
		if b, err = proto.Marshal(obj); err != nil {
			return fmt.Errorf("encoding %s: %w", id, err)
		}
	}
	err := d.db.Update(func(tx *bolt.Tx) error {
		objects := tx.Bucket(bucketObjects)
		if obj == nil {
			if err := objects.Delete([]byte(id)); err != nil {
				return err
			}
		} else if err := objects.Put([]byte(id), b); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(keyRevision, binary.BigEndian.AppendUint64(nil, rev))
	})
	if err != nil {
		return fmt.Errorf("writing revision %d to %s: %w", rev, d.path, err)
	}
	return nil
}

// close closes the file.
func (d *disk) close() error {
	if err := d.db.Close(); err != nil {
		return fmt.Errorf("closing nimbus store %s: %w", d.path, err)
	}
	return nil
}

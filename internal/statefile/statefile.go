package statefile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Sentinel errors; check with errors.Is.
var (
	// ErrCorrupt is wrapped by the error of Open for a file that cannot be read back, unless
	// Options.Corrupt replaces it. The error names the file and says what is wrong with it.
	ErrCorrupt = errors.New("corrupt state file")
	// ErrLocked is wrapped by the error of Open and Remove for a file another process holds
	// open, unless Options.Locked replaces it.
	ErrLocked = errors.New("state file locked by another process")
)

// FormatVersion is the version of the layout this package writes and reads.
const FormatVersion = 1

// DefaultLockTimeout is the default of Options.LockTimeout.
const DefaultLockTimeout = time.Second

// The names of the buckets and meta keys of a state file; see the package documentation.
const (
	BucketObjects = "objects"
	BucketMeta    = "meta"
	KeyFormat     = "format"
	KeyEpoch      = "epoch"
	KeyRevision   = "revision"
)

var (
	bucketObjects = []byte(BucketObjects)
	bucketMeta    = []byte(BucketMeta)
	keyFormat     = []byte(KeyFormat)
	keyEpoch      = []byte(KeyEpoch)
	keyRevision   = []byte(KeyRevision)
)

// Options configures Open and Remove. The zero value is usable.
type Options struct {
	// LockTimeout is how long Open and Remove wait for another process to let go of the
	// file before they fail with the locked error. Default: DefaultLockTimeout (1s).
	LockTimeout time.Duration
	// AcceptUnversioned makes Open take a file whose meta bucket has no format key, as
	// files written before the key existed have, for format version 1, and add the key.
	// Default: false, which refuses such a file as corrupt.
	AcceptUnversioned bool
	// Corrupt is the sentinel that the error for a corrupt file wraps, so that a caller's
	// users check the caller's own. Default: ErrCorrupt.
	Corrupt error
	// Locked is the sentinel that the error for a locked file wraps. Default: ErrLocked.
	Locked error
}

// withDefaults returns the options with every unset field at its default.
func (o Options) withDefaults() Options {
	if o.LockTimeout == 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	if o.Corrupt == nil {
		o.Corrupt = ErrCorrupt
	}
	if o.Locked == nil {
		o.Locked = ErrLocked
	}
	return o
}

// corrupt returns an error that wraps the corrupt sentinel and cause and names the file.
func (o Options) corrupt(path string, cause error) error {
	return fmt.Errorf("%s: %w: %w", path, o.Corrupt, cause)
}

// Position is where a file's objects stand in the source they were copied from.
type Position struct {
	// Epoch names the instance of the source the revision counts in.
	Epoch string
	// Revision is the source's revision the objects are complete as of.
	Revision uint64
}

// Contents is what Open read from a file.
type Contents struct {
	// Position is the stored position: "" and 0 when none was ever committed.
	Position
	// Objects are the stored objects, in key ID order.
	Objects []*nimbusv1.Object
	// Created reports that the file held no buckets, because it is new, and Open made them.
	Created bool
}

// Batch is what one Commit writes.
type Batch struct {
	// Delete are the key IDs of objects to remove; removing an absent one is no error.
	Delete []string
	// Put are objects to store, each under its key ID, after the deletions.
	Put []*nimbusv1.Object
	// Position, when not nil, replaces the stored position.
	Position *Position
}

// File is an open state file. Only one File, in one process, has a file open at a time.
// It is safe for concurrent use.
type File struct {
	db   *bolt.DB
	path string
	// mu serializes commits, which log holds the state of.
	mu  sync.Mutex
	log *commitLog
	// commits counts the commits since Open.
	commits int
	// idle runs checkpointIdle idleCheckpoint after the last commit; lastCommit is when
	// that was.
	idle       *time.Timer
	lastCommit time.Time
}

// Open opens the state file at path, creating it and its directory when absent, and reads
// everything it holds. A file that cannot be read back fails with an error wrapping the
// corrupt sentinel and naming the file, one another process holds with the locked one.
func Open(path string, opts Options) (*File, *Contents, error) {
	o := opts.withDefaults()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, nil, fmt.Errorf("creating state directory: %w", err)
	}
	db, err := o.open(path)
	if err != nil {
		return nil, nil, err
	}
	f := &File{db: db, path: path}
	c, err := f.openAndLoad(o)
	if err != nil {
		if f.log != nil {
			f.log.file.Close()
		}
		db.Close()
		return nil, nil, err
	}
	return f, c, nil
}

// openAndLoad opens the log and replays it, reads the file, and makes the log anew when
// it must be.
func (f *File) openAndLoad(o Options) (*Contents, error) {
	if err := f.openLogRecovering(o); err != nil {
		return nil, err
	}
	c, err := f.load(o)
	if err != nil {
		return nil, err
	}
	if f.log.fresh {
		if err := f.newLog(); err != nil {
			return nil, fmt.Errorf("creating the log of %s: %w", f.path, err)
		}
	}
	return c, nil
}

// initialMmapSize is how much of the bbolt file is mapped from the start. bbolt maps the
// file anew each time it outgrows the mapping, doubling it, and a commit that does copies
// every page the transaction holds first: filling a fresh file with 20,000 objects took
// nine of those, 10 % of nimbus's CPU. The mapping reserves address space, not memory,
// and the file still grows only as it is written (etcd maps 10 GiB).
const initialMmapSize = 1 << 30

// open opens the bbolt file at path and classifies what goes wrong: a held lock is the
// locked error, a file that cannot be opened at all is reported as such, and anything
// bbolt finds wrong with the content, by error or by panic, is the corrupt error.
func (o Options) open(path string) (db *bolt.DB, err error) {
	var file *os.File
	defer func() {
		if p := recover(); p != nil {
			// bbolt panicked holding the file and its lock: let go of both. The file
			// stays mapped, which costs address space and nothing else.
			if file != nil {
				unlock(file)
				file.Close()
			}
			db, err = nil, o.corrupt(path, fmt.Errorf("opening: %v", p))
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{
		Timeout:         o.LockTimeout,
		InitialMmapSize: initialMmapSize,
		OpenFile: func(name string, flag int, perm fs.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, perm)
			file = f
			return f, err
		},
	})
	if err == nil {
		return db, nil
	}
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("%s: %w", path, o.Locked)
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Op == "open" {
		return nil, fmt.Errorf("opening state file: %w", err)
	}
	return nil, o.corrupt(path, err)
}

// load reads the position and every object, checking the layout, the format version and
// that each object parses and is stored under its own key ID. A file without buckets is
// new: load creates them and stamps the format version, as it does for an unversioned
// file it accepts.
func (f *File) load(o Options) (c *Contents, err error) {
	defer func() {
		if p := recover(); p != nil {
			c, err = nil, o.corrupt(f.path, fmt.Errorf("reading: %v", p))
		}
	}()
	c = &Contents{}
	stamp := false
	err = f.db.View(func(tx *bolt.Tx) error {
		objs, meta := tx.Bucket(bucketObjects), tx.Bucket(bucketMeta)
		switch {
		case objs == nil && meta == nil:
			c.Created, stamp = true, true
			return nil
		case objs == nil:
			return fmt.Errorf("bucket %q is missing", bucketObjects)
		case meta == nil:
			return fmt.Errorf("bucket %q is missing", bucketMeta)
		}
		format, ok, err := readUint(meta, keyFormat)
		switch {
		case err != nil:
			return err
		case !ok && o.AcceptUnversioned:
			format, stamp = 1, true
		case !ok:
			return fmt.Errorf("meta %q is missing", keyFormat)
		}
		if format != FormatVersion {
			return fmt.Errorf("format version %d, want %d", format, FormatVersion)
		}
		if c.Revision, _, err = readUint(meta, keyRevision); err != nil {
			return err
		}
		c.Epoch = string(meta.Get(keyEpoch))
		return objs.ForEach(func(k, v []byte) error {
			obj := &nimbusv1.Object{}
			if err := proto.Unmarshal(v, obj); err != nil {
				return fmt.Errorf("object %q: %w", k, err)
			}
			if id := obj.Key().ID(); id != string(k) {
				return fmt.Errorf("object %q holds %s", k, id)
			}
			c.Objects = append(c.Objects, obj)
			return nil
		})
	})
	if err != nil {
		return nil, o.corrupt(f.path, err)
	}
	if stamp {
		if err := f.stamp(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// openLogRecovering opens the log, taking a panic of bbolt's on a damaged page for the
// corrupt error, as load does.
func (f *File) openLogRecovering(o Options) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = o.corrupt(f.path, fmt.Errorf("reading: %v", p))
		}
	}()
	return f.openLog(o)
}

// stamp creates the buckets that are missing and writes the format version.
func (f *File) stamp() error {
	err := f.db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(bucketObjects); err != nil {
			return err
		}
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		return meta.Put(keyFormat, binary.BigEndian.AppendUint64(nil, FormatVersion))
	})
	if err != nil {
		return fmt.Errorf("initializing %s: %w", f.path, err)
	}
	return nil
}

// readUint reads an 8-byte big-endian value and reports whether there was one.
func readUint(b *bolt.Bucket, key []byte) (uint64, bool, error) {
	v := b.Get(key)
	if v == nil {
		return 0, false, nil
	}
	if len(v) != 8 {
		return 0, false, fmt.Errorf("meta %q: %d bytes, want 8", key, len(v))
	}
	return binary.BigEndian.Uint64(v), true, nil
}

// Path returns the path of the file.
func (f *File) Path() string { return f.path }

// Commit writes b durably: after it returns nil the whole batch is on disk; after an
// error, or a crash, none of it is. A small batch is appended to the file's log, with one
// fdatasync; a large one, and the log when it is full, go into bbolt (see log.go). The
// log also goes into bbolt once commits stop for a while (idleCheckpoint).
func (f *File) Commit(b Batch) error {
	enc, err := encodeBatch(b)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.log == nil {
		return fmt.Errorf("writing %s: %w", f.path, bolterrors.ErrDatabaseNotOpen)
	}
	if err := f.logCommit(enc); err != nil {
		return fmt.Errorf("writing %s: %w", f.path, err)
	}
	f.commits++
	if idleCheckpoint > 0 && f.log.off > logStart {
		f.lastCommit = time.Now()
		if f.idle == nil {
			f.idle = time.AfterFunc(idleCheckpoint, f.checkpointIdle)
		} else {
			f.idle.Reset(idleCheckpoint)
		}
	}
	return nil
}

// checkpointIdle puts the log into bbolt once no commit has come for idleCheckpoint. A
// commit that came since the timer fired has set it again. A failure is left to the next
// checkpoint to report: the log holds every commit until one succeeds.
func (f *File) checkpointIdle() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.log == nil || time.Since(f.lastCommit) < idleCheckpoint {
		return
	}
	_ = f.checkpoint()
}

// Commits returns the number of commits since Open.
func (f *File) Commits() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.commits
}

// ReleasePages takes the pages of the file that the process has read out of its resident
// set. bbolt reads the file through a shared read-only mapping, and Open reads every page
// of it: left alone, they count in the process's RSS for as long as the kernel does not
// need the memory, while a commit reads only the few pages it changes. ReleasePages drops
// them from the mapping (madvise MADV_DONTNEED); they stay in the page cache, and a later
// read faults them back in. It finds the mapping through bbolt (DB.Info) and holds a read
// transaction meanwhile, so that bbolt cannot map the file elsewhere as it grows. On
// systems other than Linux it does nothing.
func (f *File) ReleasePages() error {
	err := f.db.View(func(tx *bolt.Tx) error {
		// bbolt maps at least the whole file, and reads no page past the end of the
		// database as of the last commit, tx.Size: the range is mapped, and holds every
		// page bbolt has read.
		return dropPages(f.db.Info().Data, int(tx.Size()))
	})
	if err != nil {
		return fmt.Errorf("releasing the pages of %s: %w", f.path, err)
	}
	return nil
}

// Close puts what the log holds into bbolt, so that the file alone holds every commit,
// and closes the file. It is safe to call twice.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	if f.idle != nil {
		f.idle.Stop()
	}
	if f.log != nil {
		if err := f.checkpoint(); err != nil {
			errs = append(errs, fmt.Errorf("writing %s: %w", f.path, err))
		}
		f.log.file.Close()
		f.log = nil
	}
	if err := f.db.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing %s: %w", f.path, err))
	}
	return errors.Join(errs...)
}

// Remove removes the state file at path, unless another process holds it open; a file
// that is not there is no error. It removes a file whatever its content, which is what
// a corrupt file needs.
func Remove(path string, opts Options) error {
	o := opts.withDefaults()
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return removeLog(path)
	}
	// Opening takes the file's lock before it reads anything, so a locked error means
	// another process has the file open, and any other outcome means nobody has.
	db, err := o.open(path)
	if errors.Is(err, o.Locked) {
		return fmt.Errorf("removing %s: %w", path, o.Locked)
	}
	if err == nil {
		db.Close()
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing state file: %w", err)
	}
	return removeLog(path)
}

package statefile

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/encoding/protowire"
)

// The commit log. bbolt makes a transaction durable with two fdatasyncs (the pages, then
// the meta page that points at them), and a small commit costs little else: a state
// file whose commits are single objects pays two disk flushes for each. The log makes a
// small commit durable with one: it is appended to a file written in full beforehand,
// so that overwriting its blocks changes no metadata and fdatasync flushes the data
// alone. The batches logged go into bbolt together later, in one transaction (a
// checkpoint): when the log is full, before a batch too large to log, at Close, and at
// Open, which replays what the last run logged.
//
// The log file (the state file's path + LogSuffix) starts with a header: logMagic and the
// log's ID, a random number that the state file's meta bucket also holds (KeyLog), so a
// log that belongs to another state file, or to an earlier one at the same path, is never
// replayed. Records follow: the length of the batch, a CRC-32C of the rest, the commit's
// sequence number, and the batch. The meta bucket holds the sequence number of the last
// commit bbolt has (KeyLogged); replay takes the records that follow it one by one and
// stops at the first whose checksum or sequence number does not: a record cut short by a
// crash, or one left from before the last checkpoint.
const (
	// LogSuffix is added to a state file's path to name its log.
	LogSuffix = ".log"
	// KeyLog and KeyLogged are the meta keys of the log's ID and of the sequence number of
	// the last commit bbolt holds, 8-byte big-endian integers.
	KeyLog    = "log"
	KeyLogged = "logged"

	// logMagic starts the header; the log's ID follows.
	logMagic = "NAPLOG01"
	// logStart is where the first record goes, after the header.
	logStart = 16
	// recordHeader is a record's length, checksum and sequence number.
	recordHeader = 16
)

// logSize is the size of a new log file, written with zeros when the log is created;
// tests make it smaller. It holds a burst of some 20,000 objects as users write them, so
// that a burst that comes while the log is empty is made durable by appends alone, and
// goes into bbolt once it is over (idleCheckpoint). A record larger than a quarter of the
// log goes into bbolt directly (maxLogged), where the two flushes count for little next
// to writing it. A log made with another size keeps its own.
var logSize int64 = 8 << 20

// idleCheckpoint is how long after the last commit the log goes into bbolt, when it holds
// anything: a checkpoint costs a burst of commits nothing while it lasts, and the log is
// empty again, ready for the next one, soon after. Zero makes no checkpoint for idleness
// (tests). A checkpoint that fails leaves the log as it was, for the next one, when the
// log is full or at Close, to retry and report.
var idleCheckpoint = time.Second

var (
	keyLog    = []byte(KeyLog)
	keyLogged = []byte(KeyLogged)
	crcTable  = crc32.MakeTable(crc32.Castagnoli)
)

// The fields of an encoded batch: a deleted key ID, a put object (its key ID and its
// wire form, fields 1 and 2 inside), the position's epoch (present when the batch has a
// position) and revision.
const (
	fieldDelete   = 1
	fieldPut      = 2
	fieldEpoch    = 3
	fieldRevision = 4
)

// encodeBatch returns b in the form the log and the checkpoints take. It sizes the whole
// first and encodes each object in place, with the generated encoder: a batch need not be
// deterministic, as nothing compares its bytes.
func encodeBatch(b Batch) ([]byte, error) {
	ids := make([]string, len(b.Put))
	sizes := make([]int, len(b.Put))
	total := 0
	for _, id := range b.Delete {
		total += protowire.SizeTag(fieldDelete) + protowire.SizeBytes(len(id))
	}
	for i, obj := range b.Put {
		ids[i], sizes[i] = obj.Key().ID(), obj.SizeVT()
		total += protowire.SizeTag(fieldPut) + protowire.SizeBytes(putSize(ids[i], sizes[i]))
	}
	if p := b.Position; p != nil {
		total += protowire.SizeTag(fieldEpoch) + protowire.SizeBytes(len(p.Epoch)) +
			protowire.SizeTag(fieldRevision) + protowire.SizeVarint(p.Revision)
	}
	out := make([]byte, 0, total)
	for _, id := range b.Delete {
		out = protowire.AppendTag(out, fieldDelete, protowire.BytesType)
		out = protowire.AppendString(out, id)
	}
	for i, obj := range b.Put {
		id, size := ids[i], sizes[i]
		out = protowire.AppendTag(out, fieldPut, protowire.BytesType)
		out = protowire.AppendVarint(out, uint64(putSize(id, size)))
		out = protowire.AppendTag(out, 1, protowire.BytesType)
		out = protowire.AppendString(out, id)
		out = protowire.AppendTag(out, 2, protowire.BytesType)
		out = protowire.AppendVarint(out, uint64(size))
		out = slices.Grow(out, size) // room there is: total counted it
		n, err := obj.MarshalToSizedBufferVT(out[len(out) : len(out)+size])
		if err != nil || n != size {
			return nil, fmt.Errorf("encoding %s: %d bytes of %d: %v", id, n, size, err)
		}
		out = out[:len(out)+size]
	}
	if p := b.Position; p != nil {
		out = protowire.AppendTag(out, fieldEpoch, protowire.BytesType)
		out = protowire.AppendString(out, p.Epoch)
		out = protowire.AppendTag(out, fieldRevision, protowire.VarintType)
		out = protowire.AppendVarint(out, p.Revision)
	}
	return out, nil
}

// putSize returns the size of the encoded put of an object with the key ID whose
// encoded form has size bytes: field 1 the ID, field 2 the object.
func putSize(id string, size int) int {
	return protowire.SizeTag(1) + protowire.SizeBytes(len(id)) + protowire.SizeTag(2) + protowire.SizeBytes(size)
}

// A write is one change a batch makes to the objects: the wire form data put under the
// key ID id, or id deleted; seq orders the writes as they came.
type write struct {
	id, data []byte
	seq      int
	deleted  bool
}

// applyBatches writes the encoded batches in tx as if one after the other: of each
// object's writes the last, in the order of the key IDs, then the last position. bbolt
// inserts a key into its leaf's sorted entries by moving those after it, and a leaf
// grows without bound until the transaction commits: 20,000 routes put into an empty
// file in the order they came moved gigabytes, where in key order each is appended.
func applyBatches(tx *bolt.Tx, batches [][]byte) error {
	objs, meta := tx.Bucket(bucketObjects), tx.Bucket(bucketMeta)
	if objs == nil || meta == nil {
		return errors.New("the file's buckets are missing")
	}
	var writes []write
	var epoch []byte
	var revision uint64
	var positioned, revised bool
	for _, b := range batches {
		for len(b) > 0 {
			num, typ, n := protowire.ConsumeTag(b)
			if n < 0 {
				return errors.New("malformed batch")
			}
			b = b[n:]
			var v []byte
			var x uint64
			if typ == protowire.VarintType {
				x, n = protowire.ConsumeVarint(b)
			} else {
				v, n = protowire.ConsumeBytes(b)
			}
			if n < 0 {
				return errors.New("malformed batch")
			}
			b = b[n:]
			switch num {
			case fieldDelete:
				writes = append(writes, write{id: v, seq: len(writes), deleted: true})
			case fieldPut:
				id, data, ok := decodePut(v)
				if !ok {
					return errors.New("malformed batch")
				}
				writes = append(writes, write{id: id, data: data, seq: len(writes)})
			case fieldEpoch:
				epoch, positioned = v, true
			case fieldRevision:
				revision, revised = x, true
			default:
				return errors.New("malformed batch")
			}
		}
	}
	slices.SortFunc(writes, func(a, b write) int {
		if c := bytes.Compare(a.id, b.id); c != 0 {
			return c
		}
		return a.seq - b.seq
	})
	for i, w := range writes {
		if i+1 < len(writes) && bytes.Equal(w.id, writes[i+1].id) {
			continue // a later write of the same object replaces this one
		}
		if w.deleted {
			if err := objs.Delete(w.id); err != nil {
				return fmt.Errorf("deleting %s: %w", w.id, err)
			}
		} else if err := objs.Put(w.id, w.data); err != nil {
			return fmt.Errorf("storing %s: %w", w.id, err)
		}
	}
	if positioned {
		if err := meta.Put(keyEpoch, epoch); err != nil {
			return fmt.Errorf("storing epoch: %w", err)
		}
	}
	if revised {
		if err := meta.Put(keyRevision, binary.BigEndian.AppendUint64(nil, revision)); err != nil {
			return fmt.Errorf("storing revision %d: %w", revision, err)
		}
	}
	return nil
}

// decodePut returns the key ID and the wire form of an encoded put.
func decodePut(b []byte) (id, data []byte, ok bool) {
	for _, want := range []protowire.Number{1, 2} {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num != want || typ != protowire.BytesType {
			return nil, nil, false
		}
		v, vn := protowire.ConsumeBytes(b[n:])
		if vn < 0 {
			return nil, nil, false
		}
		if want == 1 {
			id = v
		} else {
			data = v
		}
		b = b[n+vn:]
	}
	return id, data, len(b) == 0
}

// commitLog is the open log of a state file.
type commitLog struct {
	file *os.File
	// off is where the next record goes.
	off int64
	// seq is the sequence number of the last commit, base that of the last commit bbolt
	// has: the log holds those in between.
	seq, base uint64
	// size is the size of the log file: logSize, or the size of a log made with another.
	size int64
	// fresh tells that the log must be made anew (newLog) before it takes a record.
	fresh bool
}

// maxLogged returns the size of the largest record the log takes.
func (l *commitLog) maxLogged() int64 { return l.size / 4 }

// openLog opens the log of the state file f and replays into bbolt what it holds past
// the last commit bbolt has. A log that is missing, damaged or not the file's own is
// marked fresh, for newLog to make anew once the file's buckets are there. Meta values
// bbolt cannot give back are the corrupt error; failing to read or write the log is an
// error naming it, not corruption.
func (f *File) openLog(o Options) error {
	var id, logged uint64
	var hasID bool
	err := f.db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return nil
		}
		var err error
		if id, hasID, err = readUint(meta, keyLog); err != nil {
			return err
		}
		logged, _, err = readUint(meta, keyLogged)
		return err
	})
	if err != nil {
		return o.corrupt(f.path, err)
	}
	path := f.path + LogSuffix
	file, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("opening the log of %s: %w", f.path, err)
	}
	f.log = &commitLog{file: file, off: logStart, seq: logged, base: logged, size: logSize}
	if st, err := file.Stat(); err == nil && st.Size() >= logStart+recordHeader {
		f.log.size = st.Size()
	}
	header := make([]byte, logStart)
	if _, err := io.ReadFull(file, header); err == nil && hasID &&
		string(header[:8]) == logMagic && binary.BigEndian.Uint64(header[8:]) == id {
		return f.replay()
	}
	f.log.fresh = true
	return nil
}

// newLog writes the log file in full, zeros after a header with a new ID, makes it
// durable, and records the ID in bbolt: from then on the log is the file's.
func (f *File) newLog() error {
	var idBytes [8]byte
	if _, err := rand.Read(idBytes[:]); err != nil {
		return fmt.Errorf("choosing a log ID: %w", err)
	}
	f.log.size = logSize
	buf := make([]byte, logSize)
	copy(buf, logMagic)
	copy(buf[8:], idBytes[:])
	if _, err := f.log.file.WriteAt(buf, 0); err != nil {
		return fmt.Errorf("writing the log: %w", err)
	}
	if err := f.log.file.Truncate(logSize); err != nil {
		return fmt.Errorf("writing the log: %w", err)
	}
	if err := f.log.file.Sync(); err != nil {
		return fmt.Errorf("writing the log: %w", err)
	}
	if err := syncDir(filepath.Dir(f.path)); err != nil {
		return err
	}
	err := f.db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if err := meta.Put(keyLog, idBytes[:]); err != nil {
			return err
		}
		return meta.Put(keyLogged, binary.BigEndian.AppendUint64(nil, f.log.seq))
	})
	if err != nil {
		return fmt.Errorf("recording the log: %w", err)
	}
	f.log.fresh = false
	return nil
}

// syncDir makes the entries of the directory dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}

// replay finds the records that follow the last commit bbolt has and puts them into
// bbolt in one transaction.
func (f *File) replay() error {
	buf := make([]byte, f.log.size)
	n, err := f.log.file.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("reading the log of %s: %w", f.path, err)
	}
	buf = buf[:n]
	off, seq := int64(logStart), f.log.base
	var batches [][]byte
	for {
		b, next, ok := readRecord(buf, off, seq+1)
		if !ok {
			break
		}
		batches, off, seq = append(batches, b), next, seq+1
	}
	if len(batches) == 0 {
		return nil
	}
	return f.checkpointBatches(batches, seq)
}

// readRecord returns the batch of the record at off in buf, and where the next record
// starts, when the record is whole and has sequence number seq.
func readRecord(buf []byte, off int64, seq uint64) (batch []byte, next int64, ok bool) {
	if off+recordHeader > int64(len(buf)) {
		return nil, 0, false
	}
	h := buf[off : off+recordHeader]
	n := int64(binary.BigEndian.Uint32(h))
	end := off + recordHeader + n
	if n == 0 || end > int64(len(buf)) || binary.BigEndian.Uint64(h[8:]) != seq ||
		crc32.Checksum(buf[off+8:end], crcTable) != binary.BigEndian.Uint32(h[4:]) {
		return nil, 0, false
	}
	return buf[off+recordHeader : end], end, true
}

// logCommit makes the encoded batch b durable as the next commit: in the log when it
// fits, after a checkpoint when the log is full; in bbolt directly, after a checkpoint,
// when it is too large to log.
func (f *File) logCommit(b []byte) error {
	l := f.log
	size := int64(recordHeader + len(b))
	if size > l.maxLogged() {
		if err := f.checkpoint(); err != nil {
			return err
		}
		return f.checkpointBatches([][]byte{b}, l.seq+1)
	}
	if l.off+size > l.size {
		if err := f.checkpoint(); err != nil {
			return err
		}
	}
	rec := make([]byte, size)
	binary.BigEndian.PutUint32(rec, uint32(len(b)))
	binary.BigEndian.PutUint64(rec[8:], l.seq+1)
	copy(rec[recordHeader:], b)
	binary.BigEndian.PutUint32(rec[4:], crc32.Checksum(rec[8:], crcTable))
	if _, err := l.file.WriteAt(rec, l.off); err != nil {
		return fmt.Errorf("writing the log: %w", err)
	}
	if err := datasync(l.file); err != nil {
		return fmt.Errorf("syncing the log: %w", err)
	}
	l.off += size
	l.seq++
	return nil
}

// checkpoint puts the batches logged since the last checkpoint into bbolt, in one
// transaction, and starts the log over.
func (f *File) checkpoint() error {
	l := f.log
	if l.off == logStart {
		return nil
	}
	buf := make([]byte, l.off)
	if _, err := l.file.ReadAt(buf, 0); err != nil {
		return fmt.Errorf("reading the log: %w", err)
	}
	var batches [][]byte
	off := int64(logStart)
	for seq := l.base + 1; off < l.off; seq++ {
		b, next, ok := readRecord(buf, off, seq)
		if !ok {
			return fmt.Errorf("reading the log: record %d at offset %d does not read back", seq, off)
		}
		batches, off = append(batches, b), next
	}
	return f.checkpointBatches(batches, l.seq)
}

// checkpointBatches puts the encoded batches into bbolt in one transaction that records
// seq, the sequence number of the last, as the last commit bbolt has, and starts the log
// over.
func (f *File) checkpointBatches(batches [][]byte, seq uint64) error {
	err := f.db.Update(func(tx *bolt.Tx) error {
		if err := applyBatches(tx, batches); err != nil {
			return err
		}
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return errors.New("the file's buckets are missing")
		}
		return meta.Put(keyLogged, binary.BigEndian.AppendUint64(nil, seq))
	})
	if err != nil {
		return fmt.Errorf("writing %s: %w", f.path, err)
	}
	f.log.off, f.log.seq, f.log.base = logStart, seq, seq
	return nil
}

// removeLog removes the log of the state file at path; one that is not there is no
// error.
func removeLog(path string) error {
	if err := os.Remove(path + LogSuffix); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the log: %w", err)
	}
	return nil
}

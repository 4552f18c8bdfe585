// Package statefile keeps desired-state objects, and the position of the source they were
// copied from, in a bbolt file. It is the durable layer delphi and nimbus share: each opens
// its own file with Open, reads back what the last run committed, and writes every change
// with Commit, in one commit that is on disk when Commit returns: a record appended to the
// file's log with one fdatasync when the change is small, one bbolt transaction (two) when
// it is large. The log goes into bbolt when it is full, a second after the last commit,
// at Close, and at Open, which replays what a run that crashed left in it (log.go
// describes it, with the log file's layout).
//
// # Layout
//
// A state file has two buckets. BucketObjects maps the key ID of each object to the object
// in wire form, a serialized nimbusv1.Object. BucketMeta holds KeyFormat, the version of
// this layout (FormatVersion) as an 8-byte big-endian integer; KeyEpoch, a string; and
// KeyRevision, an 8-byte big-endian integer. The epoch and the revision are the Position the
// objects stand at; this package stores them with the objects and gives them no other
// meaning. A missing epoch reads as "" and a missing revision as 0.
//
// Files written before the format key existed, by nimbus, have the same layout without
// KeyFormat. Open takes such a file for format version 1 when Options.AcceptUnversioned is
// set, and adds the key; otherwise it is corrupt.
//
// # Errors
//
// Open and Remove wait Options.LockTimeout for another process to let go of the file and
// then fail with an error wrapping ErrLocked. Open fails with an error wrapping ErrCorrupt,
// and naming the file, when bbolt rejects the file, a bucket or a meta value is missing or
// malformed, the format version is not FormatVersion, or an object does not parse or is
// stored under a key other than its own. bbolt panics on some kinds of damaged pages,
// while opening the file and while reading it; Open recovers and reports that as
// ErrCorrupt too. A caller that has sentinels of its own has them wrapped instead
// (Options.Corrupt, Options.Locked).
package statefile

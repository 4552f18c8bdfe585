package controller

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// BatchError is the error of an Apply or Delete that refused entries before it called
// nimbus, or whose ApplyBatch or DeleteBatch call failed. It matches nimbusv1.ErrInvalid
// when entries were invalid, whether Apply or Delete found them or nimbus refused them
// (codes.InvalidArgument); the gRPC status of a failed call stays reachable with
// status.FromError and status.Code.
type BatchError struct {
	// First and End bound the entries of the call that failed, objs[First:End] of Apply
	// or keys[First:End] of Delete, those before First having been applied or deleted;
	// both are 0 when the entries were refused before any call.
	First, End int
	// Entries are the entries refused, in the order nimbus, or the check before any call,
	// named them; empty when a call failed for another reason. nimbus describes at most a
	// few entries of a call (see Omitted).
	Entries []BatchEntry
	// Omitted is how many more entries were refused than Entries describe.
	Omitted int
	// Err is the error of the call, a gRPC status error, or the errors of the entries
	// refused before any call, joined.
	Err error
	// what says what was being done, for Error.
	what string
}

// BatchEntry is a field of one entry of an Apply or Delete that was refused.
type BatchEntry struct {
	// Index is the entry's position among the objects of Apply or the keys of Delete.
	Index int
	// Field is the path of the field within the entry, "spec.nexthops[0].gateway" or
	// "name" of a key; "" when the entry as a whole was refused, as a key that appears
	// twice is.
	Field string
	// Message says what is wrong: `spec.prefix "10.0.0.0/33": prefix length out of
	// range`, or for a conflict, `endpoint "t/web": spec.ips "10.1.0.5" is already used
	// by endpoint "t/db" in network "net1"`.
	Message string
}

// Error says what was being done and why it failed: `applying objects[0:1000], 0 of 1000
// applied before: rpc error: code = InvalidArgument desc = objects[3]
// (Route/default/default/x): spec.prefix "10.0.0.0/33": prefix length out of range`.
func (e *BatchError) Error() string { return e.what + ": " + e.Err.Error() }

// Unwrap returns Err.
func (e *BatchError) Unwrap() error { return e.Err }

// Is makes the error of a call nimbus refused for invalid entries match
// nimbusv1.ErrInvalid, as the error of entries refused before any call does through Err.
func (e *BatchError) Is(target error) bool {
	return target == nimbusv1.ErrInvalid && e.End > 0 && status.Code(e.Err) == codes.InvalidArgument
}

// checks collects the entries of an Apply or Delete found bad before any call.
type checks struct {
	errs    []error
	entries []BatchEntry
}

// add records that entry i, which at names in messages, is bad because of err, whose
// joined errors, such as the field errors of a Validate, are each an entry.
func (c *checks) add(i int, at string, err error) {
	c.errs = append(c.errs, fmt.Errorf("%s: %w", at, err))
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		var field string
		if fe := (*nimbusv1.FieldError)(nil); errors.As(e, &fe) {
			field = strings.TrimPrefix(fe.Field, "key.")
		}
		c.entries = append(c.entries, BatchEntry{Index: i, Field: field, Message: e.Error()})
	}
}

// err returns the *BatchError of the bad entries, which says what (`checking objects,
// nothing applied`), or nil when there is none.
func (c *checks) err(what string) error {
	if len(c.errs) == 0 {
		return nil
	}
	return &BatchError{Entries: c.entries, Err: errors.Join(c.errs...), what: what}
}

// callError returns the *BatchError of a call, carrying entries [lo, hi) of the repeated
// field (objects or keys), that failed with err; what says what the call was doing. The
// entries nimbus refused are read from the errdetails.BadRequest of err's status, as
// nimbusv1 documents it (BadEntriesReason).
func callError(what, field string, lo, hi int, err error) *BatchError {
	e := &BatchError{First: lo, End: hi, Err: err, what: what}
	st, ok := status.FromError(err)
	if !ok {
		return e
	}
	bad := -1
	named := map[int]bool{}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				i, path, ok := entryOf(v.GetField(), field)
				if !ok || i >= hi-lo {
					continue
				}
				named[i] = true
				e.Entries = append(e.Entries, BatchEntry{Index: lo + i, Field: path, Message: v.GetDescription()})
			}
		case *errdetails.ErrorInfo:
			if d.GetReason() == nimbusv1.BadEntriesReason && d.GetDomain() == nimbusv1.ErrorDomain {
				if n, err := strconv.Atoi(d.GetMetadata()[nimbusv1.BadEntriesKey]); err == nil {
					bad = n
				}
			}
		}
	}
	if bad > len(named) {
		e.Omitted = bad - len(named)
	}
	return e
}

// entryOf splits the field of a violation, `objects[3].spec.prefix`, into the entry's
// position in the repeated field (3) and the path within it ("spec.prefix"); ok is false
// when the field names no entry of the repeated field.
func entryOf(violation, field string) (i int, path string, ok bool) {
	rest, ok := strings.CutPrefix(violation, field+"[")
	if !ok {
		return 0, "", false
	}
	n, rest, ok := strings.Cut(rest, "]")
	if !ok {
		return 0, "", false
	}
	i, err := strconv.Atoi(n)
	if err != nil || i < 0 {
		return 0, "", false
	}
	if rest == "" {
		return i, "", true
	}
	path, ok = strings.CutPrefix(rest, ".")
	return i, path, ok
}

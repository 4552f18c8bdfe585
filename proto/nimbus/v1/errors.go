package nimbusv1

import (
	"errors"
	"fmt"
)

// Sentinel errors of the API helpers; check with errors.Is.
var (
	// ErrUnknownKind is returned for a kind name that names no v1 kind.
	ErrUnknownKind = errors.New("unknown kind")
	// ErrInvalid is wrapped by every validation error.
	ErrInvalid = errors.New("invalid object")
)

// The details of the status that refuses an ApplyBatch or DeleteBatch call for bad
// entries, codes.InvalidArgument for invalid ones and codes.FailedPrecondition for ones
// that conflict with stored objects. The status's message has a line per bad field,
// `objects[3] (Route/default/default/x): spec.prefix "10.0.0.0/33": prefix length out of
// range`, of the first entries; an errdetails.BadRequest has a field violation per line,
// its field the entry's position and the field's path within it,
// `objects[3].spec.prefix` (`keys[2].name` for a key; the position alone when the line is
// about the entry as a whole), and its description the line's text after the position
// and key. When the message leaves bad entries out, an errdetails.ErrorInfo of this
// reason and domain counts them all.
const (
	// BadEntriesReason and ErrorDomain are the reason and domain of the ErrorInfo.
	BadEntriesReason = "BAD_ENTRIES"
	ErrorDomain      = "nimbus.naples"
	// BadEntriesKey is the key of the ErrorInfo's metadata whose value is how many
	// entries are bad in all, in decimal.
	BadEntriesKey = "bad_entries"
)

// FieldError is a bad value in one field of an object. Its text names the field path and
// the value: `spec.prefix "10.0.0.0/33": prefix length out of range`.
type FieldError struct {
	// Field is the path of the field, such as "spec.nexthops[0].gateway".
	Field string
	// Value is the offending value as the user wrote it.
	Value string
	// Reason says what is wrong with it.
	Reason string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s %q: %s", e.Field, e.Value, e.Reason)
}

// Unwrap makes every FieldError match ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

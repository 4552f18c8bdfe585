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

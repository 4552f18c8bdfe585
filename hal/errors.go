package hal

import (
	"errors"
	"fmt"
)

// Sentinel errors; check with errors.Is.
var (
	// ErrClosed is returned by a Feed whose store is closed; Run then returns nil.
	ErrClosed = errors.New("store closed")
)

// Status reasons that objects of any kind report.
const (
	// ReasonUnsupported: no reconciler of this agent programs the object's kind.
	ReasonUnsupported = "Unsupported"
	// ReasonFailed: the reconcile failed with an error that names no reason.
	ReasonFailed = "ProgrammingFailed"
	// ReasonConflict: something else already holds the kernel object the object needs.
	ReasonConflict = "Conflict"
	// ReasonKernelError: the kernel refused the change.
	ReasonKernelError = "KernelError"
	// ReasonInvalid: the object is valid on its own but not with what it refers to (an
	// endpoint address outside its network's subnets, say).
	ReasonInvalid = "InvalidSpec"
)

// Error is a reconcile error that carries the reason the failed object's status reports.
type Error struct {
	// Reason is the status reason, such as ReasonConflict.
	Reason string
	// Err says what went wrong; its text is the status message.
	Err error
	// Pending tells that the object waits for something it depends on (another object,
	// a host interface): its status is PENDING, not FAILED, and it is not retried with
	// backoff, since what it waits for enqueues it when it comes (see Dependent and
	// Observer), and every resync reconciles it again.
	Pending bool
}

// Errorf returns an *Error with the reason and a message formatted as fmt.Errorf does.
func Errorf(reason, format string, args ...any) error {
	return &Error{Reason: reason, Err: fmt.Errorf(format, args...)}
}

// Pendingf returns a pending *Error (see Error.Pending) with the reason, such as
// "WaitingForNetwork", and a message formatted as fmt.Errorf does that names what the
// object waits for.
func Pendingf(reason, format string, args ...any) error {
	return &Error{Reason: reason, Err: fmt.Errorf(format, args...), Pending: true}
}

// IsPending reports whether err's chain holds a pending *Error.
func IsPending(err error) bool {
	e, ok := errors.AsType[*Error](err)
	return ok && e.Pending
}

func (e *Error) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// IsTerminal reports whether err is a failure that no retry can mend: one whose reason
// is ReasonInvalid, a spec the kernel can never take as it is. The HAL still retries it
// with backoff, as every failure, but its FAILED status says it is terminal
// (NodeStatus.terminal), so that whoever waits for the object gives up at once instead
// of waiting for the retries; any other failure (a kernel error, a conflict) may yet
// turn PROGRAMMED.
func IsTerminal(err error) bool {
	return err != nil && !IsPending(err) && ReasonOf(err) == ReasonInvalid
}

// ReasonOf returns the reason of the first *Error in err's chain, or ReasonFailed.
func ReasonOf(err error) string {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Reason
	}
	return ReasonFailed
}

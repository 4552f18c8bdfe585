// Package exitstatus tells the exit status of a command of naples from the error that
// ends it: 2 for an error in the command line or the configuration (an unknown flag, a
// bad flag value such as a node name nimbus refuses, flags that do not go together, a
// certificate file that cannot be read), which running the command again cannot mend;
// 1 for any other failure. The systemd units stop restarting a service that exits with 2
// (RestartPreventExitStatus=2).
package exitstatus

import "errors"

// Exit statuses.
const (
	// OK is the status of a command that succeeded.
	OK = 0
	// Failure is the status of a command that failed while it ran.
	Failure = 1
	// Config is the status of a command refused for its command line or configuration.
	Config = 2
)

// ErrConfig is in the chain of every error that Mark returns; check with
// errors.Is.
var ErrConfig = errors.New("configuration error")

// configError is an error in the command line or the configuration. Its message is its
// cause's alone.
type configError struct{ err error }

func (e *configError) Error() string   { return e.err.Error() }
func (e *configError) Unwrap() []error { return []error{e.err, ErrConfig} }

// Mark returns err marked as an error in the command line or the configuration, with
// the same message; nil for nil.
func Mark(err error) error {
	if err == nil || errors.Is(err, ErrConfig) {
		return err
	}
	return &configError{err: err}
}

// Of returns the exit status for the error that ended a command: OK for nil, Config for
// one marked by Mark, Failure otherwise.
func Of(err error) int {
	switch {
	case err == nil:
		return OK
	case errors.Is(err, ErrConfig):
		return Config
	}
	return Failure
}

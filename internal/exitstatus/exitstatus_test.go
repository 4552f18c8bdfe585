package exitstatus_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/naplesnet/naples/internal/exitstatus"
)

func TestOf(t *testing.T) {
	cause := errors.New(`--node "Host_A": not a valid node name`)
	marked := exitstatus.Mark(cause)
	for _, tt := range []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, exitstatus.OK},
		{"plain", errors.New("connection refused"), exitstatus.Failure},
		{"marked", marked, exitstatus.Config},
		{"marked, wrapped", fmt.Errorf("starting: %w", marked), exitstatus.Config},
		{"marked twice", exitstatus.Mark(marked), exitstatus.Config},
	} {
		if got := exitstatus.Of(tt.err); got != tt.want {
			t.Errorf("%s: Of(%v) = %d, want %d", tt.name, tt.err, got, tt.want)
		}
	}
	if marked.Error() != cause.Error() || !errors.Is(marked, cause) || exitstatus.Mark(nil) != nil {
		t.Errorf("Mark(%v) = %v: want the same message and cause", cause, marked)
	}
}

package address

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Address
		wantErr bool
	}{
		{in: "tcp://127.0.0.1:9000", want: Address{"tcp", "127.0.0.1:9000"}},
		{in: "127.0.0.1:9000", want: Address{"tcp", "127.0.0.1:9000"}},
		{in: "tcp://[::1]:9000", want: Address{"tcp", "[::1]:9000"}},
		{in: "unix:///run/nimbus.sock", want: Address{"unix", "/run/nimbus.sock"}},
		{in: "unix://relative.sock", wantErr: true},
		{in: "http://x:1", wantErr: true},
		{in: "tcp://noport", wantErr: true},
	} {
		got, err := Parse(tc.in)
		if tc.wantErr {
			if !errors.Is(err, ErrBadAddress) {
				t.Errorf("Parse(%q) error = %v, want ErrBadAddress", tc.in, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestListenReplacesStaleSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "s.sock")
	a := Address{Network: "unix", Addr: path}
	l, err := a.Listen(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// A second listener on a live socket is refused.
	if _, err := a.Listen(context.Background()); err == nil {
		t.Fatal("second Listen on a served socket succeeded")
	}
	// Leave the socket file behind as a crashed process would.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	l2, err := a.Listen(context.Background())
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	l2.Close()
}

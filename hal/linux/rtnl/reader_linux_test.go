package rtnl

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// newFakeKernelReader returns a reader whose socket leads to a stand-in for the kernel,
// the other end of which it returns.
func newFakeKernelReader(t *testing.T, timeout time.Duration) (*Reader, int) {
	t.Helper()
	f, kernel := fakeKernelSocket(t)
	opened := false
	d, err := newReaderOn(func() (*os.File, error) {
		if opened {
			return nil, errors.New("the stand-in for the kernel has one socket")
		}
		opened = true
		return f, nil
	}, timeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		unix.Close(kernel)
	})
	return d, kernel
}

// fakeAnswer returns a netlink message of type typ answering request seq, with a
// payload of four bytes.
func fakeAnswer(typ uint16, seq uint32, flags uint16) []byte {
	msg := make([]byte, unix.NLMSG_HDRLEN+4)
	ne := binary.NativeEndian
	ne.PutUint32(msg[0:4], uint32(len(msg)))
	ne.PutUint16(msg[4:6], typ)
	ne.PutUint16(msg[6:8], flags)
	ne.PutUint32(msg[8:12], seq)
	return msg
}

// serveSlowDump reads one dump request from fd and answers it with a datagram of one
// RTM_NEWLINK message every gap, n of them, and then NLMSG_DONE unless stop; it reports
// what went wrong on errs.
func serveSlowDump(fd int, n int, gap time.Duration, stop bool, errs chan<- error) {
	buf := make([]byte, 64<<10)
	got, err := unix.Read(fd, buf)
	if err != nil || got < unix.NLMSG_HDRLEN {
		errs <- errors.Join(errors.New("reading the dump request"), err)
		return
	}
	if flags := binary.NativeEndian.Uint16(buf[6:8]); flags&unix.NLM_F_DUMP != unix.NLM_F_DUMP {
		errs <- errors.New("a dump request without NLM_F_DUMP")
		return
	}
	seq := binary.NativeEndian.Uint32(buf[8:12])
	for range n {
		time.Sleep(gap)
		if _, err := unix.Write(fd, fakeAnswer(unix.RTM_NEWLINK, seq, unix.NLM_F_MULTI)); err != nil {
			errs <- err
			return
		}
	}
	if !stop {
		if _, err := unix.Write(fd, fakeAnswer(unix.NLMSG_DONE, seq, unix.NLM_F_MULTI)); err != nil {
			errs <- err
			return
		}
	}
	errs <- nil
}

// TestReaderDumpTimeoutSinceLastMessage: a dump whose answer keeps coming, each part
// well within the timeout, is read to its end however long it takes in all; one whose
// answer stops fails with ErrNoAnswer a timeout after its last part.
func TestReaderDumpTimeoutSinceLastMessage(t *testing.T) {
	const timeout = 400 * time.Millisecond
	const gap = timeout / 4
	for _, tc := range []struct {
		name string
		stop bool
	}{{"progressing", false}, {"stopped", true}} {
		t.Run(tc.name, func(t *testing.T) {
			d, kernel := newFakeKernelReader(t, timeout)
			const parts = 12 // 3 timeouts in all
			errs := make(chan error, 1)
			go serveSlowDump(kernel, parts, gap, tc.stop, errs)
			var links int
			start := time.Now()
			err := d.Dump(context.Background(), Message(nil, unix.RTM_GETLINK, 0), func() { links = 0 },
				func(typ uint16, _ []byte) {
					if typ == unix.RTM_NEWLINK {
						links++
					}
				})
			took := time.Since(start)
			if serr := <-errs; serr != nil {
				t.Fatalf("the stand-in for the kernel: %v", serr)
			}
			if links != parts {
				t.Errorf("the dump gave %d links, want %d", links, parts)
			}
			if tc.stop {
				if !errors.Is(err, ErrNoAnswer) {
					t.Fatalf("a dump whose answer stopped: err = %v, want ErrNoAnswer", err)
				}
				if took < parts*gap+timeout {
					t.Errorf("the dump failed after %v, before a timeout since its last part (%v)", took, parts*gap+timeout)
				}
				return
			}
			if err != nil {
				t.Fatalf("a dump that kept receiving for %v with a timeout of %v: %v", took, timeout, err)
			}
			if took < 2*timeout {
				t.Errorf("the dump took %v; the test wants it to outlast the timeout (%v)", took, timeout)
			}
		})
	}
}

// TestReaderGetTimeout: a get the kernel does not answer fails with ErrNoAnswer after the
// timeout.
func TestReaderGetTimeout(t *testing.T) {
	d, kernel := newFakeKernelReader(t, 100*time.Millisecond)
	err := d.Get(context.Background(), Message(nil, unix.RTM_GETLINK, 0), func(uint16, []byte) {})
	if !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("a get the kernel does not answer: err = %v, want ErrNoAnswer", err)
	}
	buf := make([]byte, 4096)
	if n, err := unix.Read(kernel, buf); err != nil || n < unix.NLMSG_HDRLEN {
		t.Fatalf("the stand-in for the kernel read %d bytes of the request: %v", n, err)
	}
}

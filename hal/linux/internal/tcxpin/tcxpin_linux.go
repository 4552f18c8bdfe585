package tcxpin

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Attach makes the link pinned at path run prog at the tcx hook at of the interface with
// the index. A link pinned there already and attached to that interface (left by a
// previous process) is kept when same(prog, the id of the program it runs), and is made
// to run prog otherwise: an atomic replacement, which no packet notices. One attached
// elsewhere (the interface was made anew) or detached is replaced by a new link. It must
// run in the interface's network namespace. It reports whether it attached or updated a
// link.
func Attach(path string, ifindex int, prog *ebpf.Program, at ebpf.AttachType, same func(*ebpf.Program, ebpf.ProgramID) bool) (bool, error) {
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		info, ierr := l.Info()
		if ierr == nil && info.TCX() != nil && int(info.TCX().Ifindex) == ifindex {
			defer l.Close()
			if info.Program != 0 && same(prog, info.Program) {
				return false, nil
			}
			if err := l.Update(prog); err != nil {
				return false, fmt.Errorf("updating the program of the link on interface %d: %w", ifindex, err)
			}
			return true, nil
		}
		l.Unpin()
		l.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		os.Remove(path)
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at})
	if err != nil {
		return false, fmt.Errorf("attaching to interface %d: %w", ifindex, err)
	}
	defer l.Close()
	if err := l.Pin(path); err != nil {
		return false, fmt.Errorf("pinning the link of interface %d: %w", ifindex, err)
	}
	return true, nil
}

// Attached tells whether the link pinned at path is attached to the interface with the
// index. A link whose pin was removed (and no process holds) is gone, and one detached by
// hand (`bpftool link detach`) or left by an interface that was deleted reports no
// interface: neither is attached.
func Attached(path string, ifindex int) bool {
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		return false
	}
	defer l.Close()
	return LinkAttached(l, ifindex)
}

// LinkAttached tells whether the tcx link l is attached to the interface with the index.
func LinkAttached(l link.Link, ifindex int) bool {
	info, err := l.Info()
	return err == nil && info.TCX() != nil && int(info.TCX().Ifindex) == ifindex
}

// Names returns, sorted, the names NAME of the links pinned in dir as NAME-ingress or
// NAME-egress.
func Names(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), "-ingress")
		if !ok {
			name, ok = strings.CutSuffix(e.Name(), "-egress")
		}
		if ok && !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// Detach removes the link pinned at path, which detaches its program. A link that is not
// there is no error.
func Detach(path string) error {
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			return os.Remove(path)
		}
		return nil
	}
	defer l.Close()
	return l.Unpin()
}

//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64

// The generated bindings exist for little-endian machines only (bpf2go -target bpfel), and
// so does this file: the build constraint is theirs.

package gwbpf

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal/linux/internal/tcxpin"
)

// ErrFull is the error of SetMark when the map holds marks for as many bridges as it can.
var ErrFull = errors.New("the gateway map holds as many bridges as it can")

// Objects are the gateway programs and their map. With a pin directory the map and the
// links outlive the process, so that a restarted agent takes them over without a gap;
// without one the links last as long as the Objects.
type Objects struct {
	// Ingress and Egress are the programs of a bridge's tcx hooks.
	Ingress, Egress *ebpf.Program
	// Marks maps bridge interface indexes to marks.
	Marks *ebpf.Map

	dir string
	// mu guards links.
	mu sync.Mutex
	// links holds, without a pin directory, the links of each bridge by name.
	links map[string][2]link.Link
}

// Open loads the programs and a map of marks for the number of bridges (0:
// DefaultBridges). With dir set (a directory of bpffs, made when missing) it reuses the
// map pinned there, replacing one of another size (the marks it held are then lost
// until they are set again), and Attach pins the links under dir/links; with dir empty
// nothing is pinned.
func Open(dir string, bridges int) (*Objects, error) {
	spec, err := loadGateway()
	if err != nil {
		return nil, fmt.Errorf("loading the gateway's program spec: %w", err)
	}
	if bridges <= 0 {
		bridges = DefaultBridges
	}
	spec.Maps[MapMarks].MaxEntries = uint32(bridges)
	opts := ebpf.CollectionOptions{}
	if dir == "" {
		for _, m := range spec.Maps {
			m.Pinning = ebpf.PinNone
		}
	} else {
		if err := os.MkdirAll(filepath.Join(dir, "links"), 0o700); err != nil {
			return nil, fmt.Errorf("making the gateway's pin directory: %w", err)
		}
		opts.Maps.PinPath = dir
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, opts)
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		if rerr := os.Remove(filepath.Join(dir, MapMarks)); rerr != nil {
			return nil, fmt.Errorf("replacing the gateway's pinned map of another size: %w", rerr)
		}
		coll, err = ebpf.NewCollectionWithOptions(spec, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("loading the gateway's programs and map: %w", err)
	}
	defer coll.Close()
	return &Objects{
		Ingress: coll.DetachProgram(ProgIngress),
		Egress:  coll.DetachProgram(ProgEgress),
		Marks:   coll.DetachMap(MapMarks),
		dir:     dir,
		links:   map[string][2]link.Link{},
	}, nil
}

// Pinned tells whether the map and links are pinned.
func (o *Objects) Pinned() bool { return o.dir != "" }

// Close releases the process's references; pinned links and the pinned map stay,
// unpinned links go, which detaches their programs. It is safe to call twice.
func (o *Objects) Close() error {
	o.mu.Lock()
	for name, ls := range o.links {
		ls[0].Close()
		ls[1].Close()
		delete(o.links, name)
	}
	o.mu.Unlock()
	o.Ingress.Close()
	o.Egress.Close()
	return o.Marks.Close()
}

// SetMark makes the bridge with the index mark what comes up through it with mark, and
// reports whether that took a write. When the map holds as many bridges as it can, the
// error is ErrFull.
func (o *Objects) SetMark(ifindex, mark uint32) (bool, error) {
	var have uint32
	if err := o.Marks.Lookup(ifindex, &have); err == nil && have == mark {
		return false, nil
	}
	if err := o.Marks.Put(ifindex, mark); err != nil {
		if errors.Is(err, unix.E2BIG) {
			err = fmt.Errorf("%w (%d)", ErrFull, o.Marks.MaxEntries())
		}
		return false, fmt.Errorf("setting the gateway mark of interface %d: %w", ifindex, err)
	}
	return true, nil
}

// DeleteMark drops the mark of the bridge with the index; one that is not there is no
// error.
func (o *Objects) DeleteMark(ifindex uint32) error {
	if err := o.Marks.Delete(ifindex); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("deleting the gateway mark of interface %d: %w", ifindex, err)
	}
	return nil
}

// MarksByIndex returns the marks the map holds, by interface index.
func (o *Objects) MarksByIndex() (map[uint32]uint32, error) {
	got := map[uint32]uint32{}
	var k, v uint32
	it := o.Marks.Iterate()
	for it.Next(&k, &v) {
		got[k] = v
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading the gateway marks: %w", err)
	}
	return got, nil
}

// Attach attaches the programs to both tcx hooks of the bridge with the index, under its
// name: pinned under dir/links when pinned, where links a previous agent left on the same
// interface are kept when they run the same code and are made to run this process's
// programs otherwise (an atomic replacement), and links
// on an interface that is gone are replaced. It must run in the bridge's network
// namespace. It returns how many links it attached or updated.
func (o *Objects) Attach(name string, ifindex int) (int, error) {
	if o.dir == "" {
		return o.attachUnpinned(name, ifindex)
	}
	changed := 0
	for i, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		did, err := tcxpin.Attach(o.linkPath(name, i), ifindex, o.program(i), at, sameCode)
		if did {
			changed++
		}
		if err != nil {
			return changed, fmt.Errorf("attaching the gateway program: %w", err)
		}
	}
	return changed, nil
}

// attachUnpinned attaches the programs to the bridge with the index, keeping the links
// in memory, unless the links it holds for the name are on that interface already.
func (o *Objects) attachUnpinned(name string, ifindex int) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if ls, ok := o.links[name]; ok {
		if tcxpin.LinkAttached(ls[0], ifindex) && tcxpin.LinkAttached(ls[1], ifindex) {
			return 0, nil
		}
		ls[0].Close()
		ls[1].Close()
		delete(o.links, name)
	}
	var ls [2]link.Link
	for i, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: o.program(i), Attach: at})
		if err != nil {
			if i == 1 {
				ls[0].Close()
			}
			return 0, fmt.Errorf("attaching the gateway program to interface %d: %w", ifindex, err)
		}
		ls[i] = l
	}
	o.links[name] = ls
	return 2, nil
}

// Detach removes the links of the bridge of the name, which detaches the programs. Links
// that are not there are no error.
func (o *Objects) Detach(name string) error {
	if o.dir == "" {
		o.mu.Lock()
		defer o.mu.Unlock()
		if ls, ok := o.links[name]; ok {
			ls[0].Close()
			ls[1].Close()
			delete(o.links, name)
		}
		return nil
	}
	return errors.Join(tcxpin.Detach(o.linkPath(name, 0)), tcxpin.Detach(o.linkPath(name, 1)))
}

// Attached tells whether the programs are attached to both tcx hooks of the bridge of the
// name, with the index, by the links Attach made: false when a link was detached by hand
// (`bpftool link detach`), its pin removed, or the bridge made anew.
func (o *Objects) Attached(name string, ifindex int) bool {
	if o.dir == "" {
		o.mu.Lock()
		defer o.mu.Unlock()
		ls, ok := o.links[name]
		return ok && tcxpin.LinkAttached(ls[0], ifindex) && tcxpin.LinkAttached(ls[1], ifindex)
	}
	return tcxpin.Attached(o.linkPath(name, 0), ifindex) && tcxpin.Attached(o.linkPath(name, 1), ifindex)
}

// Bridges returns the names of the bridges the programs are attached to: those with
// pinned links, or with links held in memory.
func (o *Objects) Bridges() ([]string, error) {
	if o.dir == "" {
		o.mu.Lock()
		defer o.mu.Unlock()
		return slices.Sorted(maps.Keys(o.links)), nil
	}
	names, err := tcxpin.Names(filepath.Join(o.dir, "links"))
	if err != nil {
		return nil, fmt.Errorf("listing the gateway's pinned links: %w", err)
	}
	return names, nil
}

// program returns the ingress program for hook 0, the egress one for hook 1.
func (o *Objects) program(hook int) *ebpf.Program {
	if hook == 0 {
		return o.Ingress
	}
	return o.Egress
}

// linkPath returns the pin of the link of the bridge of the name at hook 0 (ingress) or
// 1 (egress).
func (o *Objects) linkPath(name string, hook int) string {
	return filepath.Join(o.dir, "links", name+[]string{"-ingress", "-egress"}[hook])
}

// sameCode tells whether the program with the id runs the same code as prog: the same
// program, or one with the same tag (the kernel's hash of the instructions, map
// references left out; both use the pinned map).
func sameCode(prog *ebpf.Program, id ebpf.ProgramID) bool {
	mine, err := prog.Info()
	if err != nil {
		return false
	}
	if have, ok := mine.ID(); ok && have == id {
		return true
	}
	other, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return false
	}
	defer other.Close()
	theirs, err := other.Info()
	return err == nil && theirs.Tag == mine.Tag && theirs.Tag != ""
}

// Package tcxpin attaches eBPF programs to tcx hooks as links pinned in bpffs, so that
// they outlive the process that attached them, and takes such links over after a
// restart.
package tcxpin

// Package agent wires one host together: delphi, the nimbus client that fills it and the
// HAL that programs the kernel from it, with one lifecycle.
package agent

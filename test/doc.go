// Package test holds the end-to-end tests: the real nimbus, naples-agent and naplesctl
// binaries, every host a fresh network namespace, every check made on the kernel or at
// nimbus.
package test

//go:build tools

// Package tools pins the etcd server the tests and benchmarks run.
package tools

import _ "go.etcd.io/etcd/server/v3"

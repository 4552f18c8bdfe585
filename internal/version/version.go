// Package version holds the version of naples a binary was built from, which every naples
// command prints with --version.
//
// `make release` sets it at link time:
//
//	go build -ldflags "-X github.com/naplesnet/naples/internal/version.Version=v1.2.0" ./cmd/nimbus
//
// A binary built without it reports the module version the Go toolchain stamped into it,
// such as v1.2.0 for `go install github.com/naplesnet/naples/cmd/nimbus@v1.2.0`, or "dev"
// when there is none.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the naples version of the binary. It is a variable, not a constant, so that
// the linker's -X flag can set it; nothing else should.
var Version = "dev"

// Get returns the version of the binary: Version when it was set at link time, otherwise
// the version of the main module the Go toolchain recorded in the binary, otherwise "dev".
func Get() string {
	if Version != "dev" && Version != "" {
		return Version
	}
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" && info.Main.Version != "(devel)" {
		return info.Main.Version
	}
	return "dev"
}

// String returns the line a command prints for --version: the command's name, the
// version, and the Go release and platform it was built with, as in
// "nimbus v1.2.0 (go1.26.0, linux/arm64)".
func String(command string) string {
	return fmt.Sprintf("%s %s (%s, %s/%s)", command, Get(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

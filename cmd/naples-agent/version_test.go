package main

import (
	"testing"

	"github.com/naplesnet/naples/internal/version/versiontest"
)

func TestMain(m *testing.M) { versiontest.Main(m, main) }

func TestVersionFlag(t *testing.T) {
	// --log-level makes sure --version wins over the flags that configure a run.
	versiontest.Flag(t, "naples-agent", "--log-level", "debug")
}

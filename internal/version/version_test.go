package version

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"testing"
)

func TestString(t *testing.T) {
	old := Version
	t.Cleanup(func() { Version = old })
	Version = "v1.2.3"
	want := fmt.Sprintf("nimbus v1.2.3 (%s, %s/%s)", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if got := String("nimbus"); got != want {
		t.Errorf("String(nimbus) = %q, want %q", got, want)
	}
}

func TestGetWithoutVersion(t *testing.T) {
	old := Version
	t.Cleanup(func() { Version = old })
	for _, v := range []string{"dev", ""} {
		Version = v
		// A test binary carries no module version, so nothing replaces the default.
		if got := Get(); got != "dev" {
			t.Errorf("Get() with Version %q = %q, want dev", v, got)
		}
	}
}

// TestLinkerSetsVersion builds a program with the -X flag of the Makefile's release target
// and checks that the program prints the version it was given.
func TestLinkerSetsVersion(t *testing.T) {
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`-X (\S+)=\$\(VERSION\)`).FindSubmatch(makefile)
	if m == nil {
		t.Fatal("the Makefile sets no -X ...=$(VERSION)")
	}
	const want = "github.com/naplesnet/naples/internal/version.Version"
	if string(m[1]) != want {
		t.Fatalf("the Makefile sets -X %s, want %s", m[1], want)
	}
	bin := filepath.Join(t.TempDir(), "printversion")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X "+want+"=v9.8.7-linked", "-o", bin, "./testdata/printversion")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("running %s: %v", bin, err)
	}
	if got, want := string(out), fmt.Sprintf("printversion v9.8.7-linked (%s, %s/%s)\n", runtime.Version(), runtime.GOOS, runtime.GOARCH); got != want {
		t.Errorf("printversion printed %q, want %q", got, want)
	}
}

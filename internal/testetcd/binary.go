package testetcd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// BinaryEnv names the environment variable that, when set, gives the path of an etcd
// server binary to run instead of building the pinned one.
const BinaryEnv = "NAPLES_TEST_ETCD"

// repoModule is the module path of the repository's root go.mod, which Binary looks for
// to find tools/etcd.
const repoModule = "github.com/naplesnet/naples"

// serverModule is the module the etcd server binary is built from.
const serverModule = "go.etcd.io/etcd/server/v3"

// buildTimeout bounds one build of the etcd binary, module downloads included.
const buildTimeout = 10 * time.Minute

// built remembers, for the life of the test binary, where Binary found or built etcd.
var built struct {
	mu   sync.Mutex // guards path
	path string
}

// Binary returns the path of the pinned etcd server binary, building it the first time
// on this machine (see the package documentation), and fails the test when it cannot.
func Binary(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv(BinaryEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			tb.Fatalf("$%s=%q: %v", BinaryEnv, p, err)
		}
		return p
	}
	built.mu.Lock()
	defer built.mu.Unlock()
	if built.path != "" {
		return built.path
	}
	p, err := findOrBuild()
	if err != nil {
		tb.Fatalf("etcd binary: %v", err)
	}
	built.path = p
	return p
}

// findOrBuild returns the cached etcd binary, building it under the cache's file lock
// when no other process has.
func findOrBuild() (string, error) {
	toolsDir, err := toolsDir()
	if err != nil {
		return "", err
	}
	version, err := pinnedVersion(filepath.Join(toolsDir, "go.mod"))
	if err != nil {
		return "", err
	}
	cacheDir, err := os.UserCacheDir()
	if err != nil {
		// Without $HOME or $XDG_CACHE_HOME, a directory per user in the temporary one.
		cacheDir = filepath.Join(os.TempDir(), fmt.Sprintf("cache-%d", os.Getuid()))
	}
	cacheDir = filepath.Join(cacheDir, "naples")
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("creating cache directory: %w", err)
	}
	name := fmt.Sprintf("etcd-%s-%s", version, runtime.GOARCH)
	path := filepath.Join(cacheDir, name)
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}

	unlock, err := lockFile(path + ".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	// Another process may have built it while this one waited for the lock.
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := build(toolsDir, cacheDir, path); err != nil {
		return "", err
	}
	return path, nil
}

// build runs go build for the etcd server in toolsDir, writing a temporary file in
// cacheDir that it renames to path once whole.
func build(toolsDir, cacheDir, path string) error {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("finding the go command: %w", err)
	}
	tmp, err := os.CreateTemp(cacheDir, filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("creating temporary binary: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed

	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool, "build", "-buildvcs=false", "-o", tmp.Name(), serverModule)
	cmd.Dir = toolsDir
	// The environment of the test must not turn this into a race-enabled, cgo or
	// cross-compiled build, nor into one of a workspace.
	cmd.Env = append(os.Environ(),
		"GOWORK=off", "GOFLAGS=-mod=readonly", "CGO_ENABLED=0",
		"GOOS="+runtime.GOOS, "GOARCH="+runtime.GOARCH)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building %s in %s after %v: %w\n%s",
			serverModule, toolsDir, time.Since(start).Round(time.Millisecond), err, out.Bytes())
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("installing etcd binary: %w", err)
	}
	return nil
}

// toolsDir finds tools/etcd by walking up from the working directory to the go.mod of
// the repository.
func toolsDir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding tools/etcd: %w", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if module, err := modulePath(filepath.Join(dir, "go.mod")); err == nil && module == repoModule {
			return filepath.Join(dir, "tools", "etcd"), nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("finding tools/etcd: no go.mod of module %s in %s or above", repoModule, wd)
		}
	}
}

// modulePath returns the module path a go.mod file declares.
func modulePath(gomod string) (string, error) {
	data, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`), nil
		}
	}
	return "", fmt.Errorf("%s: no module line", gomod)
}

// pinnedVersion returns the version of the etcd server module that a go.mod requires.
func pinnedVersion(gomod string) (string, error) {
	data, err := os.ReadFile(gomod)
	if err != nil {
		return "", fmt.Errorf("reading the pinned etcd version: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "require "))
		if len(f) >= 2 && f[0] == serverModule {
			return f[1], nil
		}
	}
	return "", errors.New(gomod + ": no requirement of " + serverModule)
}

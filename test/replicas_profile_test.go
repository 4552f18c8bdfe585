package test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"testing"
	"time"
)

// benchProfileDir is where BenchmarkReplicas writes CPU profiles of its phases, from
// $NAPLES_BENCH_PROFILE; empty, it writes none and the replicas serve no profiles.
func benchProfileDir() string { return os.Getenv("NAPLES_BENCH_PROFILE") }

// benchProfiles is the CPU profiles of one phase under way: one per replica that runs,
// from its /debug/pprof/profile, and one of the benchmark process.
type benchProfiles struct {
	wg   sync.WaitGroup
	self *os.File
}

// profilePhase starts CPU profiles of phase, d long, of every replica but skip and of the
// benchmark process, into $NAPLES_BENCH_PROFILE as PHASE-STORE-REPLICA.pprof; wait on
// the result before reading them. Without $NAPLES_BENCH_PROFILE it does nothing.
func profilePhase(b *testing.B, rc *replicaCluster, store, phase string, d time.Duration, skip int) *benchProfiles {
	p := &benchProfiles{}
	dir := benchProfileDir()
	if dir == "" {
		return p
	}
	for i, r := range rc.replicas {
		if i == skip {
			continue
		}
		path := filepath.Join(dir, fmt.Sprintf("%s-%s-%s.pprof", phase, store, r.name))
		url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", r.metrics, int(d.Seconds()))
		p.wg.Go(func() {
			resp, err := http.Get(url)
			if err != nil {
				b.Logf("profile %s: %v", path, err)
				return
			}
			defer resp.Body.Close()
			out, err := os.Create(path)
			if err != nil {
				b.Logf("profile %s: %v", path, err)
				return
			}
			defer out.Close()
			if _, err := io.Copy(out, resp.Body); err != nil {
				b.Logf("profile %s: %v", path, err)
			}
		})
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%s-bench.pprof", phase, store))
	out, err := os.Create(path)
	if err != nil {
		b.Logf("profile %s: %v", path, err)
		return p
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		b.Logf("profile %s: %v", path, err)
		out.Close()
		return p
	}
	p.self = out
	p.wg.Go(func() {
		time.Sleep(d)
		pprof.StopCPUProfile()
		out.Close()
	})
	return p
}

// wait waits until every profile of the phase is written.
func (p *benchProfiles) wait() { p.wg.Wait() }

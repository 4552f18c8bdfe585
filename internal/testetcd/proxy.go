package testetcd

import (
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// A Proxy forwards the connections of clients to one member, so that a test can hold
// back or cut off what that member sends them while the cluster runs on. Its methods may
// be called from any goroutine.
type Proxy struct {
	path, target string
	// mu guards lis, gate, open and cut.
	mu  sync.Mutex
	lis net.Listener
	// gate is closed while the proxy forwards; Pause replaces it with an open one.
	gate chan struct{}
	open []net.Conn
	cut  bool
	wg   sync.WaitGroup
}

// NewProxy serves a proxy to member i on a unix socket of its own, forwarding until Cut
// or the end of the test.
func (c *Cluster) NewProxy(tb testing.TB, i int) *Proxy {
	tb.Helper()
	p := &Proxy{
		path:   filepath.Join(tb.TempDir(), "proxy.sock"),
		target: strings.TrimPrefix(c.Endpoint(i), "unix://"),
		gate:   make(chan struct{}),
	}
	close(p.gate)
	if err := p.listen(); err != nil {
		tb.Fatalf("testetcd: proxy of member %s: %v", c.members[i].name, err)
	}
	tb.Cleanup(p.Cut)
	return p
}

// listen serves the proxy's socket and forwards each connection it accepts.
func (p *Proxy) listen() error {
	lis, err := net.Listen("unix", p.path)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.lis, p.cut = lis, false
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			client, err := lis.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("unix", p.target)
			if err != nil {
				client.Close()
				continue
			}
			p.mu.Lock()
			if p.cut {
				// Accepted as Cut closed the listener.
				p.mu.Unlock()
				client.Close()
				server.Close()
				continue
			}
			p.open = append(p.open, client, server)
			p.mu.Unlock()
			p.wg.Go(func() { io.Copy(server, client); server.Close() })
			p.wg.Go(func() { p.copyGated(client, server); client.Close() })
		}
	})
	return nil
}

// Endpoint returns the proxy's client URL, a unix:///path URL.
func (p *Proxy) Endpoint() string { return "unix://" + p.path }

// copyGated copies from src to dst, waiting at every read while the proxy is paused.
func (p *Proxy) copyGated(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := p.gate
			p.mu.Unlock()
			<-gate
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Pause holds back what the member sends to the clients, until Resume; what the clients
// send still reaches the member.
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gate = make(chan struct{})
}

// Resume forwards again what Pause held back, and what follows.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// Cut closes the proxy's socket and every connection through it, and waits until its
// goroutines have returned: the clients reach the member no more. It is safe to call
// twice.
func (p *Proxy) Cut() {
	p.Resume()
	p.mu.Lock()
	p.lis.Close()
	p.cut = true
	for _, c := range p.open {
		c.Close()
	}
	p.open = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// Reopen serves the proxy again, at the same address, after Cut: the clients reach the
// member again once they dial it again.
func (p *Proxy) Reopen(tb testing.TB) {
	tb.Helper()
	p.Cut()
	if err := p.listen(); err != nil {
		tb.Fatalf("testetcd: reopening the proxy %s: %v", p.path, err)
	}
}

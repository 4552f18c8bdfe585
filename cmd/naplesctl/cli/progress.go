package cli

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"
)

// Defaults of apply --wait's progress.
const (
	// terminalRedraw is how often the live progress line on a terminal is rewritten, at
	// most.
	terminalRedraw = 250 * time.Millisecond
	// summaryEvery is how often a summary line is printed when stderr is no terminal.
	summaryEvery = 5 * time.Second
	// progressNodes is how many failing nodes a progress line names.
	progressNodes = 3
)

// isTerminal reports whether w writes to a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// ticker returns a channel that receives the time every d and a function that stops it:
// c.tick when a test set it, else a time.Ticker.
func (c *cli) ticker(d time.Duration) (<-chan time.Time, func()) {
	if c.tick != nil {
		return c.tick(d)
	}
	t := time.NewTicker(d)
	return t.C, t.Stop
}

// bulkProgress returns the waitPrinter of apply --wait.
func (c *cli) bulkProgress() *bulkProgress {
	return &bulkProgress{c: c, failing: map[*waitState][]string{}, nodes: map[string]int{}}
}

// bulkProgress is the waitPrinter of apply --wait, made for manifests of thousands of
// objects: it prints nothing per object but a line for an object that FAILED on a node,
// once, naming the failing nodes and their messages, and shows one progress line, "1200
// of 2000 programmed, 2 failing (host-a, host-c)". On a terminal (cli.terminal) the line
// is rewritten in place, at most every terminalRedraw; elsewhere a line is printed every
// summaryEvery. When the wait ends, the progress line is printed a last time: on stdout
// when every object is programmed, on stderr when not.
type bulkProgress struct {
	c *cli
	// stop ends the goroutine that prints on ticks; ticked is closed when it returned.
	stop   chan struct{}
	ticked chan struct{}

	// mu guards the fields below, and the writes to stderr while the wait runs.
	mu sync.Mutex
	// total is the number of objects waited for; programmed counts those done.
	total, programmed int
	// failing holds the FAILED nodes of each object that has any.
	failing map[*waitState][]string
	// nodes counts the objects FAILED on each node.
	nodes map[string]int
	// shown is the progress line on the terminal; "" when none is.
	shown string
}

var _ waitPrinter = (*bulkProgress)(nil)

// start starts the goroutine that prints the progress line on ticks.
func (p *bulkProgress) start(states []*waitState) {
	p.total = len(states)
	every := summaryEvery
	if p.c.terminal {
		every = terminalRedraw
	}
	tick, stopTicker := p.c.ticker(every)
	p.stop, p.ticked = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(p.ticked)
		defer stopTicker()
		for {
			select {
			case <-p.stop:
				return
			case <-tick:
				p.mu.Lock()
				p.printLocked()
				p.mu.Unlock()
			}
		}
	}()
}

// printLocked shows the progress line: rewritten in place on a terminal, when it
// changed; a line of its own elsewhere.
func (p *bulkProgress) printLocked() {
	line := p.lineLocked()
	if !p.c.terminal {
		fmt.Fprintln(p.c.stderr, line)
		return
	}
	if line == p.shown {
		return
	}
	// The carriage return and the erase to the end of the line go to the terminal as
	// they are; the line, which holds node names, through Printable.
	fmt.Fprintf(raw(p.c.stderr), "\r%s\x1b[K", Printable(line))
	p.shown = line
}

// clearLocked erases the progress line from the terminal, if one is shown.
func (p *bulkProgress) clearLocked() {
	if p.shown != "" {
		io.WriteString(raw(p.c.stderr), "\r\x1b[K")
		p.shown = ""
	}
}

// lineLocked returns the progress line: "1200 of 2000 programmed, 2 failing (host-a,
// host-c…)".
func (p *bulkProgress) lineLocked() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d programmed, %d failing", p.programmed, p.total, len(p.failing))
	if len(p.nodes) > 0 {
		names := make([]string, 0, len(p.nodes))
		for n := range p.nodes {
			names = append(names, n)
		}
		slices.Sort(names)
		more := ""
		if len(names) > progressNodes {
			names, more = names[:progressNodes], "…"
		}
		b.WriteString(" (" + strings.Join(names, ", ") + more + ")")
	}
	return b.String()
}

// observed counts the object as programmed once it is done, keeps the nodes it is
// FAILED on, and prints a line for it the first time it FAILED on a node whose agent
// retries. A terminal FAILED ends the wait, whose error names the nodes.
func (p *bulkProgress) observed(s *waitState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s.done {
		p.programmed++
	}
	var nodes []string
	retried := false
	for _, n := range s.last.failures {
		nodes = append(nodes, n.GetNode())
		retried = retried || !n.GetTerminal()
	}
	old := p.failing[s]
	if slices.Equal(old, nodes) {
		return
	}
	for _, n := range old {
		if p.nodes[n]--; p.nodes[n] == 0 {
			delete(p.nodes, n)
		}
	}
	if len(nodes) == 0 {
		delete(p.failing, s)
		return
	}
	p.failing[s] = nodes
	for _, n := range nodes {
		p.nodes[n]++
	}
	if retried && !s.shown {
		s.shown = true
		p.clearLocked()
		fmt.Fprintln(p.c.stderr, failingLine(s))
	}
}

// failingLine says on which nodes the target FAILED: "route/r1: FAILED on 1 of 2 nodes
// (generation 1): host-b: KernelError (retrying): adding route: ...", ending with "; and
// N more" when the object's status does not list them all.
func failingLine(s *waitState) string {
	var b strings.Builder
	more := s.last.unlistedFailed()
	fmt.Fprintf(&b, "%s: FAILED on %d of %d nodes (generation %d):", ref(s.key), len(s.last.failures)+more, s.last.target, s.generation)
	for i, n := range s.last.failures {
		if i > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " %s: %s: %s", n.GetNode(), reasonOf(n), orDash(oneLine(n.GetMessage())))
	}
	if more > 0 {
		fmt.Fprintf(&b, "; and %d more", more)
	}
	return b.String()
}

// brief is true: the progress line counts the objects programmed, and names the nodes
// FAILED only.
func (p *bulkProgress) brief() bool { return true }

// end stops the ticks and prints the progress line a last time: on stdout when every
// object is programmed, on stderr when not.
func (p *bulkProgress) end(ok bool) {
	close(p.stop)
	<-p.ticked
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLocked()
	if ok {
		fmt.Fprintf(p.c.stdout, "%d of %d programmed on every target node\n", p.programmed, p.total)
		return
	}
	fmt.Fprintln(p.c.stderr, p.lineLocked())
}

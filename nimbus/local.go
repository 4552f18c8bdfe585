package nimbus

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	flowsv1 "github.com/naplesnet/naples/proto/nimbus/flows/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// This file is the Server's in-process read API, for readers that run in the same
// process and do their own access control, such as the web console (package
// nimbus/console): the streams of WatchStatus and ObserveFlows handed to a function
// instead of a gRPC stream, and a summary of the nodes. Get, List and ListNodeStatuses
// are called directly. None of it passes the gRPC interceptors: the caller decides who
// may read.

// errLocalRecv is what a local stream answers a receive with: the server side of a
// server-streaming call never receives after its request.
var errLocalRecv = errors.New("a local stream receives nothing")

// localStream is the server side of a server-streaming call whose client is a function
// in the same process: each message sent is handed to send, decoded when the server sent
// it pre-encoded.
type localStream[T any, PT interface {
	*T
	proto.Message
}] struct {
	ctx  context.Context
	send func(PT) error
}

// Send hands m to the function.
func (l *localStream[T, PT]) Send(m PT) error { return l.send(m) }

// SendMsg hands m to the function, decoding it first when it is pre-encoded.
func (l *localStream[T, PT]) SendMsg(m any) error {
	switch m := m.(type) {
	case PT:
		return l.send(m)
	case preEncoded:
		msg := PT(new(T))
		if err := proto.Unmarshal(m, msg); err != nil {
			return fmt.Errorf("decoding a pre-encoded %T: %w", msg, err)
		}
		return l.send(msg)
	default:
		return fmt.Errorf("local stream: cannot send a %T", m)
	}
}

// Context returns the context of the call.
func (l *localStream[T, PT]) Context() context.Context { return l.ctx }

// RecvMsg fails: see errLocalRecv.
func (l *localStream[T, PT]) RecvMsg(any) error { return errLocalRecv }

// SetHeader, SendHeader and SetTrailer do nothing: there are no headers in-process.
func (l *localStream[T, PT]) SetHeader(metadata.MD) error  { return nil }
func (l *localStream[T, PT]) SendHeader(metadata.MD) error { return nil }
func (l *localStream[T, PT]) SetTrailer(metadata.MD)       {}

// WatchStatusLocal runs WatchStatus for a reader in the same process: each frame the
// stream would carry is handed to send, in order, on the calling goroutine. It returns
// when ctx ends (with a codes.Canceled or codes.DeadlineExceeded status error), when the
// Server closes, or with the first error of send.
func (s *Server) WatchStatusLocal(ctx context.Context, req *nimbusv1.WatchStatusRequest, send func(*nimbusv1.StatusFrame) error) error {
	return s.WatchStatus(req, &localStream[nimbusv1.StatusFrame, *nimbusv1.StatusFrame]{ctx: ctx, send: send})
}

// ObserveFlowsLocal runs ObserveFlows for a reader in the same process: each response
// the stream would carry is handed to send, on the calling goroutine. It counts against
// Limits.FlowObservers as a stream does.
func (s *Server) ObserveFlowsLocal(ctx context.Context, req *flowsv1.ObserveFlowsRequest, send func(*flowsv1.ObserveFlowsResponse) error) error {
	return s.flows.ObserveFlows(req, &localStream[flowsv1.ObserveFlowsResponse, *flowsv1.ObserveFlowsResponse]{ctx: ctx, send: send})
}

// NodeSummary is what the Server knows of one node, as Nodes reports it.
type NodeSummary struct {
	// Name is the node's name.
	Name string
	// Declared is true when a Node object of that name is stored.
	Declared bool
	// Streams is how many watch streams of the node are open, here and on peer replicas.
	Streams int
	// Since is when the node's last watch stream ended; zero while one is open or when it
	// never watched since the Server started.
	Since time.Time
	// Stale is true when the node's statuses are stale: it has been without a watch
	// stream for longer than Options.StaleAfter.
	Stale bool
	// Watermark is the revision up to which the node reported everything meant for it
	// PROGRAMMED (docs/status.md), 0 for none or one of another epoch; WatermarkTime is
	// when it last moved, zero for none.
	Watermark     uint64
	WatermarkTime time.Time
	// LastReport is the latest time the node reported: its watermark's move or the update
	// time of a status it reported, whichever is later; zero when it reported nothing.
	LastReport time.Time
	// Failed is the number of objects the node reports FAILED, Reported the number of
	// objects it reported a status of on its own (the exceptions to its watermark).
	Failed, Reported int
	// AgentVersion is the version of the node's agent while it watches this server, as
	// its gRPC user agent says (nimbusv1.AgentUserAgent); empty when it watches none
	// here or does not say.
	AgentVersion string
}

// Connected tells whether the node has a watch stream open.
func (n NodeSummary) Connected() bool { return n.Streams > 0 }

// Nodes returns what the Server knows of every node it knows of, by name: the nodes
// that have a Node object, a watch stream, a watch ended, a watermark or a status. It reads
// one consistent state of the store, without a lock, and the agent versions of the
// watches open on this server under the lock of commits, briefly; its cost grows with
// the nodes, their watches and the statuses they reported on their own, not with the
// objects.
func (s *Server) Nodes() []NodeSummary {
	v := s.view()
	nodes := map[string]*NodeSummary{}
	get := func(name string) *NodeSummary {
		n, ok := nodes[name]
		if !ok {
			n = &NodeSummary{Name: name}
			nodes[name] = n
		}
		return n
	}
	for rec := range v.objectsOfKind(nimbusv1.Kind_KIND_NODE) {
		get(rec.Object.GetMeta().GetName()).Declared = true
	}
	for rec := range v.allWatchNodes() {
		n := get(rec.Name)
		n.Streams = rec.Streams
		if rec.Streams == 0 {
			n.Since = rec.Since
		}
	}
	for rec := range v.allWatermarks() {
		n := get(rec.Node)
		if rec.Epoch == v.epoch {
			n.Watermark = rec.Revision
		}
		n.WatermarkTime = rec.UpdateTime
		n.LastReport = rec.UpdateTime
	}
	for rec := range v.allStatuses() {
		n := get(rec.Node)
		n.Reported++
		if rec.Status.GetPhase() == nimbusv1.Phase_PHASE_FAILED {
			n.Failed++
		}
		if t := rec.Status.GetUpdateTime(); t != nil && t.AsTime().After(n.LastReport) {
			n.LastReport = t.AsTime()
		}
	}
	s.mu.Lock()
	for w := range s.watchers {
		if a := w.agent.Load(); w.target && a != nil && *a != "" {
			get(w.node).AgentVersion = *a
		}
	}
	s.mu.Unlock()
	out := make([]NodeSummary, 0, len(nodes))
	for _, name := range slices.Sorted(maps.Keys(nodes)) {
		n := nodes[name]
		n.Stale = v.stale(name)
		out = append(out, *n)
	}
	return out
}

// agentVersionOf returns the agent version the gRPC user agent of the call whose context
// is ctx names, "" for none.
func agentVersionOf(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, ua := range md.Get("user-agent") {
		if v := nimbusv1.AgentVersion(ua); v != "" {
			return v
		}
	}
	return ""
}

// Revision returns the revision of the latest committed change.
func (s *Server) Revision() uint64 { return s.store.read().revision() }

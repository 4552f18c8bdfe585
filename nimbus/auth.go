package nimbus

import (
	"context"
	"fmt"
	"path"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/internal/pki"
	flowsv1 "github.com/naplesnet/naples/proto/nimbus/flows/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Authorization
//
// When the Server serves TLS (Options.TLS is set), every client presents a certificate
// that a CA of Options.TLS.ClientCAs issued, and its identity (see package internal/pki)
// decides what it may call:
//
//   - Apply, ApplyBatch (dry runs too), Delete, DeleteBatch, Get, List and
//     ListNodeStatuses: publishers only. Nodes learn their objects from Watch and have no need to read or change
//     anyone else's.
//   - WatchStatus: publishers only, as List.
//   - Watch: a node for its own name only; a publisher for any node, which shows it no
//     more than List does and lets tools watch what a node receives.
//   - ReportStatus: nodes only, and every report must be for the reporting node
//     (status.node equal to the certificate's node name). The first report for another
//     node ends the stream with PermissionDenied; it and every report after it are not
//     stored, the ones before it are.
//   - PeerStatus: replicas only, and every frame that names its sender must name the
//     certificate's replica (PeerFrame.replica equal to its name), checked as for
//     ReportStatus. A replica certificate may call nothing else but ObserveFlows with
//     local_only, Version and the health service: it is the one a replica serves with,
//     on every host of the cluster.
//   - ObserveFlows (nimbus.flows.v1.Flows): publishers; replicas too, with local_only
//     set, which only they may set: it is how a replica asks its peers for their agents'
//     flow records.
//   - FlowTap (nimbus.flows.v1.Flows): nodes only, and every message that names a node
//     must name the certificate's (FlowTapUp.node equal to its node name), checked as
//     for ReportStatus.
//   - The standard health service (grpc.health.v1.Health) and Version: anyone with a
//     certificate the CAs issued, so probes need no role.
//   - Any other method: nobody.
//
// Refusals are codes.PermissionDenied with a message naming who asked for what, such as
// `node "host-a" may not watch node "host-b"`, logged at most once per identity and
// Limits.RefusalLogInterval. Streams also count against their identity (streams.go).
// Without TLS nothing is checked.

// authorizeUnary refuses unary calls the peer's identity does not allow.
func (s *Server) authorizeUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if s.opts.TLS == nil {
		return handler(ctx, req)
	}
	id, err := s.peerIdentity(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	method := path.Base(info.FullMethod)
	switch info.FullMethod {
	case healthpb.Health_Check_FullMethodName, healthpb.Health_List_FullMethodName, nimbusv1.Nimbus_Version_FullMethodName:
	case nimbusv1.Nimbus_Apply_FullMethodName, nimbusv1.Nimbus_ApplyBatch_FullMethodName,
		nimbusv1.Nimbus_Delete_FullMethodName, nimbusv1.Nimbus_DeleteBatch_FullMethodName,
		nimbusv1.Nimbus_Get_FullMethodName, nimbusv1.Nimbus_List_FullMethodName,
		nimbusv1.Nimbus_ListNodeStatuses_FullMethodName:
		if id.Role != pki.RolePublisher {
			return nil, s.deny(ctx, id, info.FullMethod, "%s may not call %s: a publisher certificate is required", id, method)
		}
	default:
		return nil, s.deny(ctx, id, info.FullMethod, "%s may not call %s: no one may", id, info.FullMethod)
	}
	return handler(ctx, req)
}

// authorizeStream refuses streams the peer's identity does not allow, and checks every
// message the handler receives against it.
func (s *Server) authorizeStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if s.opts.TLS == nil {
		return handler(srv, ss)
	}
	ctx := ss.Context()
	id, err := s.peerIdentity(ctx, info.FullMethod)
	if err != nil {
		return err
	}
	var check func(m any) error
	switch info.FullMethod {
	case healthpb.Health_Watch_FullMethodName:
		check = func(any) error { return nil }
	case nimbusv1.Nimbus_Watch_FullMethodName:
		check = func(m any) error {
			req, ok := m.(*nimbusv1.WatchRequest)
			if !ok {
				return s.deny(ctx, id, info.FullMethod, "unexpected message %T", m)
			}
			if id.Role != pki.RolePublisher && (id.Role != pki.RoleNode || req.GetNode() != id.Name) {
				return s.deny(ctx, id, info.FullMethod, "%s may not watch node %q", id, req.GetNode())
			}
			return nil
		}
	case nimbusv1.Nimbus_WatchStatus_FullMethodName:
		if id.Role != pki.RolePublisher {
			return s.deny(ctx, id, info.FullMethod, "%s may not watch status: a publisher certificate is required", id)
		}
		check = func(any) error { return nil }
	case nimbusv1.Nimbus_ReportStatus_FullMethodName:
		if id.Role != pki.RoleNode {
			return s.deny(ctx, id, info.FullMethod, "%s may not report status: a node certificate is required", id)
		}
		check = func(m any) error {
			r, ok := m.(*nimbusv1.StatusReport)
			if !ok {
				return s.deny(ctx, id, info.FullMethod, "unexpected message %T", m)
			}
			if wm := r.GetWatermark(); wm != nil {
				if node := wm.GetNode(); node != id.Name {
					return s.deny(ctx, id, info.FullMethod, "%s may not report the status watermark of node %q", id, node)
				}
				return nil
			}
			if node := r.GetStatus().GetNode(); node != id.Name {
				return s.deny(ctx, id, info.FullMethod, "%s may not report status for node %q (object %s)", id, node, r.GetKey().ID())
			}
			return nil
		}
	case nimbusv1.Nimbus_PeerStatus_FullMethodName:
		if id.Role != pki.RoleReplica {
			return s.deny(ctx, id, info.FullMethod, "%s may not push peer statuses: a replica certificate is required", id)
		}
		check = func(m any) error {
			f, ok := m.(*nimbusv1.PeerFrame)
			if !ok {
				return s.deny(ctx, id, info.FullMethod, "unexpected message %T", m)
			}
			if r := f.GetReplica(); r != "" && r != id.Name {
				return s.deny(ctx, id, info.FullMethod, "%s may not push as replica %q", id, r)
			}
			return nil
		}
	case flowsv1.Flows_ObserveFlows_FullMethodName:
		if id.Role != pki.RolePublisher && id.Role != pki.RoleReplica {
			return s.deny(ctx, id, info.FullMethod, "%s may not observe flows: a publisher certificate is required", id)
		}
		check = func(m any) error {
			req, ok := m.(*flowsv1.ObserveFlowsRequest)
			if !ok {
				return s.deny(ctx, id, info.FullMethod, "unexpected message %T", m)
			}
			if id.Role == pki.RoleReplica && !req.GetLocalOnly() {
				return s.deny(ctx, id, info.FullMethod, "%s may observe flows with local_only only", id)
			}
			if id.Role != pki.RoleReplica && req.GetLocalOnly() {
				return s.deny(ctx, id, info.FullMethod, "%s may not set local_only: a replica certificate is required", id)
			}
			return nil
		}
	case flowsv1.Flows_FlowTap_FullMethodName:
		if id.Role != pki.RoleNode {
			return s.deny(ctx, id, info.FullMethod, "%s may not tap flows: a node certificate is required", id)
		}
		check = func(m any) error {
			up, ok := m.(*flowsv1.FlowTapUp)
			if !ok {
				return s.deny(ctx, id, info.FullMethod, "unexpected message %T", m)
			}
			if node := up.GetNode(); node != "" && node != id.Name {
				return s.deny(ctx, id, info.FullMethod, "%s may not tap the flows of node %q", id, node)
			}
			return nil
		}
	default:
		return s.deny(ctx, id, info.FullMethod, "%s may not call %s: no one may", id, info.FullMethod)
	}
	if countedStream(info.FullMethod) {
		release, rates, err := s.streams.acquire(id, info.FullMethod)
		if err != nil {
			s.logRefusal(ctx, id, "stream refused", info.FullMethod, status.Convert(err).Message())
			s.streams.holdRefusal(ctx, rates)
			return err
		}
		defer release()
		if info.FullMethod == nimbusv1.Nimbus_ReportStatus_FullMethodName && rates != nil && rates.reports != nil {
			ss = &throttledStream{ServerStream: ss, rates: rates, limiter: s.streams}
		}
	}
	as := &authorizedStream{ServerStream: ss, ctx: context.WithValue(ctx, identityKey{}, id), check: check}
	err = handler(srv, as)
	// The handler may have wrapped the refusal, or ended for another reason while it
	// was on its way; the refusal is what the client needs to hear.
	if denied := as.denied.Load(); denied != nil {
		return denied.Err()
	}
	return err
}

// authorizedStream is a server stream whose received messages are checked before the
// handler sees them.
type authorizedStream struct {
	grpc.ServerStream
	// ctx is the stream's context with the peer's identity; see identityOf.
	ctx context.Context
	// check returns the refusal of a message the peer may not send.
	check func(m any) error
	// denied is the first refusal; once set, every RecvMsg returns it.
	denied atomic.Pointer[status.Status]
}

// Context returns the stream's context, which carries the peer's identity.
func (a *authorizedStream) Context() context.Context { return a.ctx }

// identityKey is the context key of the identity of a stream's peer.
type identityKey struct{}

// identityOf returns the identity of the peer of the stream whose context is ctx, once
// authorizeStream has checked it; false without TLS.
func identityOf(ctx context.Context) (pki.Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(pki.Identity)
	return id, ok
}

// watchMakesTarget tells whether the watch stream whose context is ctx makes its node a
// target of the objects for every node: only the node's own watch does, with TLS one of
// a node certificate (which may watch only its own name). A publisher watching a node,
// the way to see what that node receives, is no node. Without TLS nobody has an
// identity, so every watch is taken for the node's own.
func (s *Server) watchMakesTarget(ctx context.Context) bool {
	if s.opts.TLS == nil {
		return true
	}
	id, ok := identityOf(ctx)
	return ok && id.Role == pki.RoleNode
}

// RecvMsg receives the next message and hands it on only if the peer may send it.
func (a *authorizedStream) RecvMsg(m any) error {
	if denied := a.denied.Load(); denied != nil {
		return denied.Err()
	}
	if err := a.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if err := a.check(m); err != nil {
		a.denied.CompareAndSwap(nil, status.Convert(err))
		return a.denied.Load().Err()
	}
	return nil
}

// peerIdentity returns the identity of the RPC's peer, named by its verified client
// certificate, or the status error to refuse the RPC with.
func (s *Server) peerIdentity(ctx context.Context, method string) (pki.Identity, error) {
	p, ok := peer.FromContext(ctx)
	var info credentials.TLSInfo
	if ok {
		info, ok = p.AuthInfo.(credentials.TLSInfo)
	}
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		s.log.Warn("refused a call without a verified client certificate", "method", method, "peer", peerAddr(p))
		return pki.Identity{}, status.Error(codes.Unauthenticated, "a verified client certificate is required")
	}
	id, err := pki.IdentityOf(info.State.VerifiedChains[0][0])
	if err != nil {
		s.log.Warn("refused a certificate without a naples identity", "method", method, "peer", peerAddr(p), "error", err)
		return pki.Identity{}, status.Error(codes.PermissionDenied, err.Error())
	}
	return id, nil
}

// deny logs a refusal and returns it as a PermissionDenied status error.
func (s *Server) deny(ctx context.Context, id pki.Identity, method, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	s.logRefusal(ctx, id, "permission denied", method, msg)
	return status.Error(codes.PermissionDenied, msg)
}

// logRefusal logs that a call or stream of the identity was refused, unless a refusal of
// its kind (what) was logged for the identity within Limits.RefusalLogInterval; the line
// says how many were refused and not logged since the one before.
func (s *Server) logRefusal(ctx context.Context, id pki.Identity, what, method, reason string) {
	ok, held := s.refusals.allow(refusalKey(id, what))
	if !ok {
		return
	}
	p, _ := peer.FromContext(ctx)
	s.log.Warn(what, "method", method, "identity", id.String(), "peer", peerAddr(p), "reason", reason,
		"refused_unlogged", held)
}

// peerAddr returns the peer's address for logs.
func peerAddr(p *peer.Peer) string {
	if p == nil || p.Addr == nil {
		return "unknown"
	}
	return p.Addr.String()
}

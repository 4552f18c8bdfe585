package nimbus

import (
	"context"
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Apply creates or updates an object. An invalid object is refused with
// codes.InvalidArgument naming the bad fields, and nothing is stored. It returns once the
// change is durable; concurrent writes share commits (see the package documentation).
func (s *Server) Apply(ctx context.Context, req *nimbusv1.ApplyRequest) (*nimbusv1.ApplyResponse, error) {
	in := req.GetObject()
	if in == nil {
		return nil, status.Error(codes.InvalidArgument, `object "": is required`)
	}
	if err := in.Validate(); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := s.checkObjectSize(in); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	b := &batch{writes: []write{applyWrite(in)}}
	if err := s.submit(b); err != nil {
		return nil, rpcError(err)
	}
	return applyResponse(b.outcomes[0]), nil
}

// applyResponse is the answer to the apply whose outcome is out.
func applyResponse(out outcome) *nimbusv1.ApplyResponse {
	return &nimbusv1.ApplyResponse{Object: out.obj, Changed: out.changed, Created: out.created}
}

// targetsNode tells whether the stored object targets the node, as Object.TargetsNode
// does, in a binary search of its target nodes, which a stored object holds sorted: an
// object for 10,000 nodes is asked about each of them.
func targetsNode(obj *nimbusv1.Object, node string) bool {
	nodes := obj.GetMeta().GetNodes()
	if len(nodes) == 0 {
		return true
	}
	_, found := slices.BinarySearch(nodes, node)
	return found
}

// normalizeNodes returns the node names sorted and without duplicates, so that the order
// a publisher lists them in is not a change.
func normalizeNodes(nodes []string) []string {
	if len(nodes) == 0 {
		return nil
	}
	return slices.Compact(slices.Sorted(slices.Values(nodes)))
}

// Delete deletes an object and every status reported for it. Deleting an object that does
// not exist succeeds with found false and the current revision. It returns once the
// deletion is durable.
func (s *Server) Delete(ctx context.Context, req *nimbusv1.DeleteRequest) (*nimbusv1.DeleteResponse, error) {
	key := req.GetKey()
	if err := key.Validate(); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	b := &batch{writes: []write{deleteWrite(key)}, deleting: true}
	if err := s.submit(b); err != nil {
		return nil, rpcError(err)
	}
	return deleteResponse(b.outcomes[0]), nil
}

// deleteResponse is the answer to the deletion whose outcome is out.
func deleteResponse(out outcome) *nimbusv1.DeleteResponse {
	return &nimbusv1.DeleteResponse{Found: out.changed, Revision: out.rev}
}

// Get returns one object with its status, or codes.NotFound.
func (s *Server) Get(ctx context.Context, req *nimbusv1.GetRequest) (*nimbusv1.GetResponse, error) {
	key := req.GetKey()
	if err := key.Validate(); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	id := key.Key()
	v := s.view()
	rec := v.object(id)
	if rec == nil {
		return nil, status.Errorf(codes.NotFound, "object %s not found", id)
	}
	return &nimbusv1.GetResponse{Item: v.withStatus(rec)}, nil
}

// List returns a page of the objects that match the request's filters with their status,
// ordered by key ID, and the revision they are current at. A page ends at the request's
// limit or before the item that would take it over Limits.ListPageBytes, with a
// next_page_token that the request for the next page carries.
func (s *Server) List(ctx context.Context, req *nimbusv1.ListRequest) (*nimbusv1.ListResponse, error) {
	after, err := parsePageToken(req.GetPageToken())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	v := s.view()
	page := &listPage{resp: &nimbusv1.ListResponse{Revision: v.revision()}, limit: int(req.GetLimit()), pageBytes: s.opts.Limits.ListPageBytes}
	for rec := range v.objectsAfter(req.GetKind(), after) {
		m := rec.Object.GetMeta()
		if (req.GetTenant() != "" && m.GetTenant() != req.GetTenant()) ||
			(req.GetNamespace() != "" && m.GetNamespace() != req.GetNamespace()) {
			continue
		}
		if !page.add(rec.Key, v.withStatus(rec)) {
			s.metrics.listPagesCut.Inc()
			break
		}
	}
	return page.resp, nil
}

// view is one consistent read of the store: a published version of its tables, with what
// the status aggregation needs besides.
type view struct {
	*tables
	// every holds the target nodes of an object for every node, sorted, once everyNode
	// has read them, which everyRead tells.
	every     []string
	everyRead bool
	// derived holds, by index in every, the status last derived for that node of an
	// object for every node: the objects of a generation whose generation revisions the
	// node's watermark passed in one move share it (see status).
	derived []derivedStatus
	// everyMarks holds, by index in every, the node's watermark or nil, once status has
	// read them.
	everyMarks []*watermarkRecord
	// staleSince is the time a node must have had no open watch since for its statuses
	// to be stale; zero when statuses never are.
	staleSince time.Time
	// started is when the Server was made, which counts as the last watch of a node that
	// has never watched.
	started time.Time
	// epoch is the server's epoch: the nodes' watermarks of another say nothing.
	epoch string
	// detailsBytes is Limits.StatusDetailsBytes; see status.
	detailsBytes int
	metrics      *metrics
}

// view starts a read of the current state of the store. It takes no lock.
func (s *Server) view() *view {
	v := &view{tables: s.store.read(), epoch: s.Epoch(), started: s.started, detailsBytes: s.opts.Limits.StatusDetailsBytes, metrics: s.metrics}
	if s.opts.StaleAfter > 0 {
		v.staleSince = s.opts.Now().Add(-s.opts.StaleAfter)
	}
	return v
}

// stale tells whether the node's statuses are stale: it has no open watch and has had
// none since v.staleSince.
func (v *view) stale(node string) bool {
	if v.staleSince.IsZero() {
		return false
	}
	last := v.started
	if rec := v.watchNode(node); rec != nil {
		if rec.Streams > 0 {
			return false
		}
		last = rec.Since
	}
	return !last.After(v.staleSince)
}

// everyNode returns the target nodes of an object for every node, sorted: the nodes there
// are Node objects for, together with the nodes that have a watch stream open now. A node
// that only watched once, or only reported a status, is not among them.
func (v *view) everyNode() []string {
	if v.everyRead {
		return v.every
	}
	nodes := map[string]struct{}{}
	for rec := range v.objectsOfKind(nimbusv1.Kind_KIND_NODE) {
		nodes[rec.Object.GetMeta().GetName()] = struct{}{}
	}
	for rec := range v.allWatchNodes() {
		if rec.Streams > 0 {
			nodes[rec.Name] = struct{}{}
		}
	}
	v.every, v.everyRead = slices.Sorted(maps.Keys(nodes)), true
	return v.every
}

// derivedStatus is a status derived from a node's watermark: PROGRAMMED at gen since at.
type derivedStatus struct {
	gen int64
	at  time.Time
	ns  *nimbusv1.NodeStatus
}

// withStatus pairs the record's object with its aggregated status.
func (v *view) withStatus(rec *objectRecord) *nimbusv1.ObjectWithStatus {
	return &nimbusv1.ObjectWithStatus{Object: rec.Object, Status: v.status(rec)}
}

// status aggregates what the nodes the record's object targets reported about it. The
// target nodes are meta.nodes, or, for an object for every node, those everyNode returns:
// the nodes with a Node object and the nodes watching now. Only target nodes count, in
// every field: a status kept for a node that is no target now (it stopped watching and
// has no Node object) is left out, and counts again once the node is a target again.
//
// A node's status of the object is the record it reported, whatever its generation (one
// without a phase is nothing reported);
// without one, PROGRAMMED at the object's generation when the node's watermark, of the
// server's epoch, passes the object's generation revision, since the time it did
// (derived); else nothing reported.
func (v *view) status(rec *objectRecord) *nimbusv1.ObjectStatus {
	obj := rec.Object
	recs := v.statusesOfID(rec.id)
	m := obj.GetMeta()
	gen := m.GetGeneration()
	genRev := obj.GenerationRevision()
	// Only the target nodes' statuses are looked up below.
	reported := make(map[string]*nimbusv1.NodeStatus, len(recs))
	for _, r := range recs {
		reported[r.Node] = r.Status
	}
	targets := m.GetNodes()
	var derived []derivedStatus
	if len(targets) == 0 {
		targets = v.everyNode()
		if v.derived == nil {
			v.derived = make([]derivedStatus, len(targets))
			v.everyMarks = make([]*watermarkRecord, len(targets))
			for i, n := range targets {
				v.everyMarks[i] = v.watermark(n)
			}
		}
		derived = v.derived
	}
	st := &nimbusv1.ObjectStatus{TargetNodes: int32(len(targets)), Generation: gen}
	caughtUp := len(targets) > 0
	var caughtUpTime *timestamppb.Timestamp
	details := 0
	for i, n := range targets {
		ns, ok := reported[n]
		if ok && ns.GetPhase() == nimbusv1.Phase_PHASE_UNSPECIFIED {
			// A node that reports no phase tells that it has nothing to tell yet, and
			// that its watermark does not speak for the object.
			st.Pending = append(st.Pending, n)
			caughtUp = false
			continue
		}
		if !ok {
			var wm *watermarkRecord
			if derived != nil {
				wm = v.everyMarks[i]
			} else {
				wm = v.watermark(n)
			}
			if !wm.passes(v.epoch, genRev) {
				st.Pending = append(st.Pending, n)
				caughtUp = false
				continue
			}
			at := wm.passedAt(genRev)
			if derived != nil && derived[i].ns != nil && derived[i].gen == gen && derived[i].at.Equal(at) {
				ns = derived[i].ns
			} else {
				ns = &nimbusv1.NodeStatus{
					Node: n, ObservedGeneration: gen, Phase: nimbusv1.Phase_PHASE_PROGRAMMED,
					UpdateTime: timestamppb.New(at),
				}
				if derived != nil {
					derived[i] = derivedStatus{gen, at, ns}
				}
			}
		}
		// A node whose details would take the object's over the budget goes without
		// them, so that the status of an object of any number of nodes stays readable.
		if d := statusDetailsSize(ns); d > 0 {
			if details+d > v.detailsBytes {
				ns = withoutDetails(ns)
				st.DetailsOmitted++
			} else {
				details += d
			}
		}
		if v.stale(n) {
			// Stored statuses are immutable; the stale mark goes on a copy.
			ns = proto.Clone(ns).(*nimbusv1.NodeStatus)
			ns.Stale = true
			st.StaleNodes++
		}
		st.Nodes = append(st.Nodes, ns)
		current := ns.GetObservedGeneration() == gen
		if current {
			st.CurrentNodes++
		}
		switch {
		case current && ns.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED:
			st.ProgrammedNodes++
			if t := ns.GetUpdateTime(); caughtUpTime == nil || t.AsTime().After(caughtUpTime.AsTime()) {
				caughtUpTime = t
			}
		case current && ns.GetPhase() == nimbusv1.Phase_PHASE_FAILED:
			st.FailedNodes++
			caughtUp = false
		default:
			st.Pending = append(st.Pending, n)
			caughtUp = false
		}
	}
	if caughtUp {
		st.CaughtUpTime = caughtUpTime
	}
	if st.DetailsOmitted > 0 && v.metrics != nil {
		v.metrics.detailsOmitted.Inc()
	}
	return st
}

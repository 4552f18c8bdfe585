package nimbus

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"strings"
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
// With dry_run it answers what the apply would do and stores nothing (see dryrun.go).
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
	b := &batch{writes: []write{applyWrite(in, ownsRequest(ctx))}}
	if err := s.submitOrDryRun(b, req.GetDryRun()); err != nil {
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
	// st is the store the view reads, whose cache of every's names views share.
	st *store
	// marks indexes the watermarks of the nodes of every, once everyMarks has read them.
	marks *everyMarks
	// staleSince is the time a node must have had no open watch since for its statuses
	// to be stale; zero when statuses never are.
	staleSince time.Time
	// started is when the Server was made, which counts as the last watch of a node that
	// has never watched.
	started time.Time
	// epoch is the server's epoch: the nodes' watermarks of another say nothing.
	epoch string
	// detailsBytes is Limits.StatusDetailsBytes, statusNodes Limits.StatusNodes; see
	// capLists.
	detailsBytes, statusNodes int
	metrics                   *metrics
}

// view starts a read of the current state of the store. It takes no lock.
func (s *Server) view() *view {
	v := &view{tables: s.store.read(), st: s.store, epoch: s.Epoch(), started: s.started, detailsBytes: s.opts.Limits.StatusDetailsBytes,
		statusNodes: s.opts.Limits.StatusNodes, metrics: s.metrics}
	if s.opts.StaleAfter > 0 {
		v.staleSince = s.opts.Now().Add(-s.opts.StaleAfter)
	}
	return v
}

// stale tells whether the node's statuses are stale: it has no open watch and has had
// none since v.staleSince.
func (v *view) stale(node string) bool {
	stale, _, _ := v.staleness(node)
	return stale
}

// staleness tells whether the node's statuses are stale, and, when it has no open watch
// and statuses can be stale, when its last watch ended, which counts: its statuses are
// stale in the views whose staleSince is at or after it.
func (v *view) staleness(node string) (stale bool, last time.Time, counts bool) {
	if v.staleSince.IsZero() {
		return false, time.Time{}, false
	}
	last = v.started
	if rec := v.watchNode(node); rec != nil {
		if rec.Streams > 0 {
			return false, time.Time{}, false
		}
		last = rec.Since
	}
	return !last.After(v.staleSince), last, true
}

// everyNode returns the target nodes of an object for every node, sorted: the nodes there
// are Node objects for, together with the nodes that have a watch stream open now. A node
// that only watched once, or only reported a status, is not among them. The views of
// versions with the same nodesGen share them: the caller must not modify them.
func (v *view) everyNode() []string {
	if v.everyRead {
		return v.every
	}
	if v.st != nil {
		if names, ok := v.st.cachedEveryNode(v.nodesGen); ok {
			v.every, v.everyRead = names, true
			return v.every
		}
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
	if v.st != nil {
		v.st.cacheEveryNode(v.nodesGen, v.every)
	}
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
//
// The counts count every target node; the lists of nodes and of pending nodes hold at
// most Limits.StatusNodes of them (see capLists). An object for every node takes
// everyStatus, which counts without a walk of the nodes; an object that lists its nodes
// walks them.
func (v *view) status(rec *objectRecord) *nimbusv1.ObjectStatus {
	obj := rec.Object
	recs := v.statusesOfID(rec.id)
	m := obj.GetMeta()
	gen := m.GetGeneration()
	genRev := obj.GenerationRevision()
	targets := m.GetNodes()
	if len(targets) == 0 {
		return v.everyStatus(rec, recs)
	}
	// Only the target nodes' statuses are looked up below.
	reported := make(map[string]*nimbusv1.NodeStatus, len(recs))
	for _, r := range recs {
		reported[r.Node] = r.Status
	}
	st := &nimbusv1.ObjectStatus{TargetNodes: int32(len(targets)), Generation: gen}
	var caughtUpTime *timestamppb.Timestamp
	var nodes []listedNode
	var pending []pendingNode
	for _, n := range targets {
		wm := v.watermark(n)
		ns, ok := reported[n]
		if ok && ns.GetPhase() == nimbusv1.Phase_PHASE_UNSPECIFIED {
			// A node that reports no phase tells that it has nothing to tell yet, and
			// that its watermark does not speak for the object.
			pending = append(pending, pendingNode{n, wm.mark(v.epoch)})
			continue
		}
		tier := tierTold
		if ok && ns.GetPhase() == nimbusv1.Phase_PHASE_FAILED {
			tier = tierFailed
		}
		if !ok {
			if !wm.passes(v.epoch, genRev) {
				pending = append(pending, pendingNode{n, wm.mark(v.epoch)})
				continue
			}
			tier = tierProgrammed
			ns = derivedNodeStatus(n, gen, wm.passedAt(genRev))
		}
		stale := v.stale(n)
		if stale {
			st.StaleNodes++
			tier = min(tier, tierTold)
		}
		nodes = append(nodes, listedNode{ns, tier, stale})
		if tally(st, ns, gen, &caughtUpTime) {
			pending = append(pending, pendingNode{n, wm.mark(v.epoch)})
		}
	}
	if int(st.ProgrammedNodes) == len(targets) {
		st.CaughtUpTime = caughtUpTime
	}
	v.capLists(st, nodes, len(nodes), pending, len(pending))
	return st
}

// briefStatus returns the brief entry of the record's object, an object with target
// nodes, and true when none of the object's records is FAILED or has a reason or a
// message: then status(rec) is quiet and has the entry's counts, which briefStatus counts
// without making it. It returns false for an object for every node, and for one whose
// records may tell more than counts: its status must be made.
func (v *view) briefStatus(rec *objectRecord) (briefEntry, bool) {
	m := rec.Object.GetMeta()
	targets := m.GetNodes()
	if len(targets) == 0 {
		return briefEntry{}, false
	}
	recs := v.statusesOfID(rec.id)
	for _, r := range recs {
		if ns := r.Status; ns.GetPhase() == nimbusv1.Phase_PHASE_FAILED || ns.GetReason() != "" || ns.GetMessage() != "" {
			return briefEntry{}, false
		}
	}
	// A node's record is searched for among a few, and looked up among many, so that an
	// object of thousands of target nodes with as many records costs no walk for each.
	var reported map[string]*nimbusv1.NodeStatus
	if len(recs) > briefScan {
		reported = make(map[string]*nimbusv1.NodeStatus, len(recs))
		for _, r := range recs {
			reported[r.Node] = r.Status
		}
	}
	gen, genRev := m.GetGeneration(), rec.Object.GenerationRevision()
	e := briefEntry{generation: gen, target: int32(len(targets))}
	for _, n := range targets {
		var ns *nimbusv1.NodeStatus
		if reported != nil {
			ns = reported[n]
		} else {
			for _, r := range recs {
				if r.Node == n {
					ns = r.Status
					break
				}
			}
		}
		switch {
		case ns == nil:
			// Derived from the watermark: PROGRAMMED at gen once it passed genRev.
			if v.watermark(n).passes(v.epoch, genRev) {
				e.programmed++
			}
		case ns.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED && ns.GetObservedGeneration() == gen:
			e.programmed++
		}
	}
	return e, true
}

// briefScan is the number of an object's records up to which briefStatus searches them
// for a node's rather than index them.
const briefScan = 8

// tally counts the status ns of a target node of an object at generation gen in st's
// counts but stale_nodes, moves *latest to its update time when it is PROGRAMMED at gen
// and that is later, and tells whether the node is pending.
func tally(st *nimbusv1.ObjectStatus, ns *nimbusv1.NodeStatus, gen int64, latest **timestamppb.Timestamp) (pending bool) {
	current := ns.GetObservedGeneration() == gen
	if current {
		st.CurrentNodes++
	}
	switch {
	case current && ns.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED:
		st.ProgrammedNodes++
		if t := ns.GetUpdateTime(); *latest == nil || t.AsTime().After((*latest).AsTime()) {
			*latest = t
		}
		return false
	case current && ns.GetPhase() == nimbusv1.Phase_PHASE_FAILED:
		st.FailedNodes++
		return false
	}
	return true
}

// Tiers of the node statuses an object's status lists: when there are more than
// Limits.StatusNodes, the lower tiers are kept first, by name within a tier.
const (
	// tierFailed is a status the node reported FAILED, at any generation.
	tierFailed int8 = iota
	// tierTold is another status the node reported (PENDING, an older generation,
	// operational data), or the status of a stale node.
	tierTold
	// tierProgrammed is a status derived from the node's watermark: PROGRAMMED at the
	// generation.
	tierProgrammed
)

// listedNode is a node's status an object's status may list.
type listedNode struct {
	ns   *nimbusv1.NodeStatus
	tier int8
	// stale tells that the node's statuses are stale; ns is not marked yet.
	stale bool
}

// pendingNode is a pending node an object's status may list, with its watermark.
type pendingNode struct {
	name string
	// mark is the node's watermark (see watermarkRecord.mark).
	mark uint64
}

// capLists sets st's nodes and pending from the candidates, of total nodes and
// totalPending in all (the candidates hold at least Limits.StatusNodes of each, or all),
// each at most Limits.StatusNodes, and the counts of the ones left out. The nodes kept
// are those of the lowest tiers, by name within a tier; the pending ones those furthest
// behind, the lowest watermark first, by name among equals. Both lists then go by name,
// and the kept nodes get their stale mark and their details within
// Limits.StatusDetailsBytes, in name order: a node whose details would take the sum over
// it goes without them, so that the status of an object of any number of nodes stays
// readable.
func (v *view) capLists(st *nimbusv1.ObjectStatus, nodes []listedNode, total int, pending []pendingNode, totalPending int) {
	limit := v.statusNodes
	byName := func(a, b listedNode) int { return strings.Compare(a.ns.GetNode(), b.ns.GetNode()) }
	if len(nodes) > limit {
		slices.SortFunc(nodes, func(a, b listedNode) int { return cmp.Or(cmp.Compare(a.tier, b.tier), byName(a, b)) })
		nodes = nodes[:limit]
	}
	slices.SortFunc(nodes, byName)
	st.NodesOmitted = int32(total - len(nodes))
	if len(nodes) > 0 {
		st.Nodes = make([]*nimbusv1.NodeStatus, 0, len(nodes))
	}
	details := 0
	for _, n := range nodes {
		ns := n.ns
		if d := statusDetailsSize(ns); d > 0 {
			if details+d > v.detailsBytes {
				ns = withoutDetails(ns)
				st.DetailsOmitted++
			} else {
				details += d
			}
		}
		if n.stale {
			// Stored statuses are immutable; the stale mark goes on a copy.
			ns = proto.Clone(ns).(*nimbusv1.NodeStatus)
			ns.Stale = true
		}
		st.Nodes = append(st.Nodes, ns)
	}
	if len(pending) > limit {
		slices.SortFunc(pending, func(a, b pendingNode) int {
			return cmp.Or(cmp.Compare(a.mark, b.mark), strings.Compare(a.name, b.name))
		})
		pending = pending[:limit]
	}
	slices.SortFunc(pending, func(a, b pendingNode) int { return strings.Compare(a.name, b.name) })
	st.PendingOmitted = int32(totalPending - len(pending))
	if len(pending) > 0 {
		st.Pending = make([]string, len(pending))
		for i, p := range pending {
			st.Pending[i] = p.name
		}
	}
	if st.DetailsOmitted > 0 && v.metrics != nil {
		v.metrics.detailsOmitted.Inc()
	}
	if (st.NodesOmitted > 0 || st.PendingOmitted > 0) && v.metrics != nil {
		v.metrics.nodesOmitted.Inc()
	}
}

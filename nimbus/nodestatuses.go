package nimbus

import (
	"context"
	"encoding/base64"
	"iter"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

const (
	// DefaultNodeStatusesPage is the entries of a ListNodeStatuses page when the request
	// leaves its limit 0.
	DefaultNodeStatusesPage = 1000
	// MaxNodeStatusesPage bounds the entries of a ListNodeStatuses page, whatever limit
	// the request asks for.
	MaxNodeStatusesPage = 10000
	// nodeStatusesScan bounds the nodes a ListNodeStatuses page looks at, when its limit
	// is smaller: a page with a filter that few nodes pass ends there, with a
	// next_page_token, rather than look at every node of the fleet.
	nodeStatusesScan = 10000
)

// ListNodeStatuses returns a page of an object's status on each of its target nodes, in
// node name order, from the page token's node on: every target node, or those the
// request's filter selects. A page ends at the request's limit (DefaultNodeStatusesPage
// for 0, at most MaxNodeStatusesPage), before the entry that would take it over
// Limits.ListPageBytes, or once it has looked at nodeStatusesScan nodes (or limit, if
// more); its next_page_token names the last node it looked at. A page costs
// O((limit + nodes looked at) × log n) for n nodes, not O(n): it seeks its first node
// in the sorted tables and looks up each node's record, watermark and watch state.
//
// An object of no such key is codes.NotFound; a bad key, page token, limit or filter
// codes.InvalidArgument naming the field and the value.
func (s *Server) ListNodeStatuses(ctx context.Context, req *nimbusv1.ListNodeStatusesRequest) (*nimbusv1.ListNodeStatusesResponse, error) {
	key := req.GetKey()
	if err := key.Validate(); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	after, err := parseNodePageToken(req.GetPageToken())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	limit := int(req.GetLimit())
	switch {
	case limit < 0:
		return nil, status.Error(codes.InvalidArgument, (&nimbusv1.FieldError{
			Field: "limit", Value: strconv.Itoa(limit), Reason: "must not be negative",
		}).Error())
	case limit == 0:
		limit = DefaultNodeStatusesPage
	case limit > MaxNodeStatusesPage:
		limit = MaxNodeStatusesPage
	}
	keep, err := nodeStatusFilter(req.GetFilter())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	id := key.Key()
	v := s.view()
	rec := v.object(id)
	if rec == nil {
		return nil, status.Errorf(codes.NotFound, "object %s not found", id)
	}
	gen := rec.Object.GetMeta().GetGeneration()
	resp := &nimbusv1.ListNodeStatusesResponse{Generation: gen, Revision: v.revision()}
	scan := max(limit, nodeStatusesScan)
	bytes, looked, last := 0, 0, ""
	for node, target := range v.targetsAfter(rec, after) {
		if looked == scan || len(resp.Entries) == limit {
			resp.NextPageToken = nodePageToken(last)
			break
		}
		if !target {
			looked++
			last = node
			continue
		}
		ns, _ := v.nodeStatusOf(rec, node)
		if keep(ns, gen) {
			e := &nimbusv1.NodeStatusEntry{Node: node, Status: ns}
			n := e.SizeVT()
			n += protowire.SizeTag(1) + protowire.SizeVarint(uint64(n))
			if len(resp.Entries) > 0 && bytes+n > s.opts.Limits.ListPageBytes {
				resp.NextPageToken = nodePageToken(last)
				break
			}
			resp.Entries = append(resp.Entries, e)
			bytes += n
		}
		looked++
		last = node
	}
	if resp.NextPageToken != "" {
		s.metrics.nodeStatusPagesCut.Inc()
	}
	return resp, nil
}

// nodeStatusFilter returns what selects a node's status ns (nil for nothing reported) of
// an object at generation gen for the filter.
func nodeStatusFilter(f nimbusv1.NodeStatusFilter) (func(ns *nimbusv1.NodeStatus, gen int64) bool, error) {
	switch f {
	case nimbusv1.NodeStatusFilter_NODE_STATUS_FILTER_UNSPECIFIED:
		return func(*nimbusv1.NodeStatus, int64) bool { return true }, nil
	case nimbusv1.NodeStatusFilter_NODE_STATUS_FILTER_NOT_PROGRAMMED:
		return func(ns *nimbusv1.NodeStatus, gen int64) bool {
			return ns.GetObservedGeneration() != gen || ns.GetPhase() != nimbusv1.Phase_PHASE_PROGRAMMED
		}, nil
	case nimbusv1.NodeStatusFilter_NODE_STATUS_FILTER_FAILED:
		return func(ns *nimbusv1.NodeStatus, gen int64) bool {
			return ns.GetObservedGeneration() == gen && ns.GetPhase() == nimbusv1.Phase_PHASE_FAILED
		}, nil
	}
	return nil, &nimbusv1.FieldError{Field: "filter", Value: f.String(), Reason: "not a filter nimbus knows"}
}

// nodeStatusOf returns the status of the record's object on the node, one of its target
// nodes, as status lists it in ObjectStatus.nodes: the record the node reported, whatever
// its generation; without one, PROGRAMMED at the object's generation when the node's
// watermark, of the server's epoch, passes the object's generation revision, since the
// time it did; marked stale, on a copy, when the node's statuses are. It returns nil and
// false when the node reported nothing: no record and no watermark that passes, or a
// record without a phase.
func (v *view) nodeStatusOf(rec *objectRecord, node string) (*nimbusv1.NodeStatus, bool) {
	var ns *nimbusv1.NodeStatus
	if r := v.nodeStatusID(rec.id, node); r != nil {
		if r.Status.GetPhase() == nimbusv1.Phase_PHASE_UNSPECIFIED {
			return nil, false
		}
		ns = r.Status
	} else {
		genRev := rec.Object.GenerationRevision()
		wm := v.watermark(node)
		if !wm.passes(v.epoch, genRev) {
			return nil, false
		}
		ns = derivedNodeStatus(node, rec.Object.GetMeta().GetGeneration(), wm.passedAt(genRev))
	}
	if v.stale(node) {
		// Stored statuses are immutable; the stale mark goes on a copy.
		ns = proto.CloneOf(ns)
		ns.Stale = true
	}
	return ns, true
}

// targetsAfter iterates over the target nodes of the record's object whose names come
// after the name after, in name order: those of meta.nodes, or, for an object for every
// node, those everyNode returns, without reading all of them. Each comes with true; a
// name that comes with false is no target, but one the iteration went past: a node that
// watched once and watches no more, which a page counts as looked at, so that a page
// past many of them stays bounded.
func (v *view) targetsAfter(rec *objectRecord, after string) iter.Seq2[string, bool] {
	if nodes := rec.Object.GetMeta().GetNodes(); len(nodes) > 0 {
		return func(yield func(string, bool) bool) {
			i, found := slices.BinarySearch(nodes, after)
			if found {
				i++
			}
			for _, n := range nodes[i:] {
				if !yield(n, true) {
					return
				}
			}
		}
	}
	return v.everyNodeAfter(after)
}

// everyNodeAfter iterates over the nodes everyNode returns whose names come after the
// name after, in name order, each with true, and the nodes with a watch record but no
// open watch stream and no Node object between them, with false. It merges the names of
// the Node objects of each tenant and namespace there are Node objects in, and the names
// of the watch records, each from after on.
func (v *view) everyNodeAfter(after string) iter.Seq2[string, bool] {
	return func(yield func(string, bool) bool) {
		var heads []*nameHead
		defer func() {
			for _, h := range heads {
				h.stop()
			}
		}()
		for prefix := range v.nodeObjectsPrefixes() {
			heads = append(heads, newNameHead(v.nodeObjectsAfter(prefix, after)))
		}
		heads = append(heads, newNameHead(v.watchNodesAfter(after)))
		for {
			var next *nameHead
			for _, h := range heads {
				if h.ok && (next == nil || h.name < next.name) {
					next = h
				}
			}
			if next == nil {
				return
			}
			name, target := next.name, false
			for _, h := range heads {
				for h.ok && h.name == name {
					target = target || h.target
					h.advance()
				}
			}
			if !yield(name, target) {
				return
			}
		}
	}
}

// nameHead is the next name of a sequence of names in order, pulled one at a time, with
// whether it names a target node.
type nameHead struct {
	next func() (string, bool, bool)
	stop func()
	// name is the sequence's current name, and target whether it names a target node,
	// while ok.
	name       string
	target, ok bool
}

// newNameHead pulls the first name of seq.
func newNameHead(seq iter.Seq2[string, bool]) *nameHead {
	next, stop := iter.Pull2(seq)
	h := &nameHead{next: next, stop: stop}
	h.advance()
	return h
}

// advance pulls the sequence's next name.
func (h *nameHead) advance() { h.name, h.target, h.ok = h.next() }

// nodeObjectsPrefixes iterates over the key ID prefixes, "Node/tenant/namespace/", of
// the tenants and namespaces there are Node objects in, seeking from one to the next.
func (v *view) nodeObjectsPrefixes() iter.Seq[string] {
	return func(yield func(string) bool) {
		kind := nimbusv1.Kind_KIND_NODE.Name() + "/"
		from := kind
		for {
			prefix := ""
			v.objects.Ascend(from, func(id string, _ *objectRecord) bool {
				if strings.HasPrefix(id, kind) {
					prefix = id[:strings.LastIndexByte(id, '/')+1]
				}
				return false
			})
			if prefix == "" || !yield(prefix) {
				return
			}
			// Every key ID from prefix up to the one that ends in '0' in place of the
			// prefix's last '/' starts with prefix.
			from = prefix[:len(prefix)-1] + "0"
		}
	}
}

// nodeObjectsAfter iterates over the names of the Node objects whose key IDs start with
// prefix and whose names come after the name after, in name order, each with true: a
// Node object makes its node a target.
func (v *view) nodeObjectsAfter(prefix, after string) iter.Seq2[string, bool] {
	return func(yield func(string, bool) bool) {
		from := prefix + after
		v.objects.Ascend(from, func(id string, _ *objectRecord) bool {
			if id == from {
				return true
			}
			return strings.HasPrefix(id, prefix) && yield(id[len(prefix):], true)
		})
	}
}

// watchNodesAfter iterates over the names of the nodes with a watch record whose names
// come after the name after, in name order, each with whether the node has a watch
// stream open now, which makes it a target.
func (v *view) watchNodesAfter(after string) iter.Seq2[string, bool] {
	return func(yield func(string, bool) bool) {
		v.watchNodes.Ascend(after, func(name string, rec *watchNodeRecord) bool {
			return name == after || yield(name, rec.Streams > 0)
		})
	}
}

// nodePageToken returns the token of the ListNodeStatuses page after the node.
func nodePageToken(node string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(node))
}

// parseNodePageToken returns the node name a ListNodeStatuses page token continues
// after; empty for the first page.
func parseNodePageToken(token string) (string, error) {
	if token == "" {
		return "", nil
	}
	name, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || validateNode(string(name)) != nil {
		return "", &nimbusv1.FieldError{Field: "page_token", Value: token, Reason: "not a next_page_token of ListNodeStatuses"}
	}
	return string(name), nil
}

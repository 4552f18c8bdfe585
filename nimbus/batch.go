package nimbus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// maxReportedInvalid is how many bad entries the refusal of a batch describes; it counts
// the rest.
const maxReportedInvalid = 10

// ApplyBatch creates or updates many objects at once. Every object is validated first: an
// invalid one, or a key that appears twice, refuses the whole call with
// codes.InvalidArgument, one line per bad field naming the object's position and key,
// `objects[3] (Route/default/default/x): spec.prefix "10.0.0.0/33": prefix length out of
// range`, and nothing is stored. The status carries the same as an errdetails.BadRequest
// (see refusal). Otherwise the objects are applied in order, each as Apply
// would, in one store transaction and one state-file commit: every object that changes
// takes the next revision, and watchers receive the changes together once they are
// durable. The results are in the order of the objects; each carries the stored object,
// so the response is larger than the request, and a client sending a large batch raises
// its receive limit (grpc.MaxCallRecvMsgSize) to match, or sets omit_objects to receive
// only each object's generation and revision. A request is at most 16 MiB. With dry_run it
// answers what the batch would do, refused as it would be, and stores nothing (see
// dryrun.go).
func (s *Server) ApplyBatch(ctx context.Context, req *nimbusv1.ApplyBatchRequest) (*nimbusv1.ApplyBatchResponse, error) {
	objs := req.GetObjects()
	if len(objs) >= BurstObjects && s.opts.Burst != nil {
		s.opts.Burst()
	}
	b := &batch{writes: make([]write, 0, len(objs)), positions: true}
	var bad refusal
	seen := make(map[nimbusv1.Key]int, len(objs))
	owned := ownsRequest(ctx)
	for i, in := range objs {
		if in == nil {
			bad.add(fmt.Sprintf("objects[%d]", i), "", errors.New(`object "": is required`))
			continue
		}
		id := in.TypedKey()
		if err := in.Validate(); err != nil {
			bad.add(fmt.Sprintf("objects[%d]", i), id.String(), err)
			continue
		}
		if err := s.checkObjectSize(in); err != nil {
			bad.add(fmt.Sprintf("objects[%d]", i), id.String(), err)
			continue
		}
		if j, ok := seen[id]; ok {
			bad.add(fmt.Sprintf("objects[%d]", i), id.String(),
				fmt.Errorf("the key of objects[%d] again: a key may appear once per batch", j))
			continue
		}
		seen[id] = i
		if !bad.any() {
			b.writes = append(b.writes, applyWrite(in, owned))
		}
	}
	if err := bad.err(); err != nil {
		return nil, err
	}
	if err := s.submitOrDryRun(b, req.GetDryRun()); err != nil {
		return nil, rpcError(err)
	}
	resp := &nimbusv1.ApplyBatchResponse{Results: make([]*nimbusv1.ApplyResponse, len(b.outcomes)), Revision: b.rev, Transactions: uint32(b.txns)}
	for i, out := range b.outcomes {
		if req.GetOmitObjects() {
			resp.Results[i] = omittedResponse(out)
			continue
		}
		resp.Results[i] = applyResponse(out)
	}
	return resp, nil
}

// omittedResponse returns the result of one apply without the stored object: only its
// generation and revision, for a request with omit_objects.
func omittedResponse(out outcome) *nimbusv1.ApplyResponse {
	meta := out.obj.GetMeta()
	return &nimbusv1.ApplyResponse{
		Object:  &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Generation: meta.GetGeneration(), Revision: meta.GetRevision()}},
		Changed: out.changed,
		Created: out.created,
	}
}

// DeleteBatch deletes many objects at once, with every status reported for them. Every key
// is validated first: an invalid one, or one that appears twice, refuses the whole call
// with codes.InvalidArgument naming its position, `keys[2] (Route/default/default/R1):
// key.name "R1": ...`, and nothing is deleted. Otherwise the objects are deleted in order,
// each as Delete would, in one store transaction and one state-file commit: every object
// that existed takes the next revision, absent ones are no error (found false), and
// watchers receive the deletions together once they are durable.
func (s *Server) DeleteBatch(ctx context.Context, req *nimbusv1.DeleteBatchRequest) (*nimbusv1.DeleteBatchResponse, error) {
	keys := req.GetKeys()
	b := &batch{writes: make([]write, 0, len(keys)), deleting: true}
	var bad refusal
	seen := make(map[nimbusv1.Key]int, len(keys))
	for i, key := range keys {
		id := key.Key()
		if err := key.Validate(); err != nil {
			bad.add(fmt.Sprintf("keys[%d]", i), id.String(), err)
			continue
		}
		if j, ok := seen[id]; ok {
			bad.add(fmt.Sprintf("keys[%d]", i), id.String(),
				fmt.Errorf("the key of keys[%d] again: a key may appear once per batch", j))
			continue
		}
		seen[id] = i
		if !bad.any() {
			b.writes = append(b.writes, deleteWrite(key))
		}
	}
	if err := bad.err(); err != nil {
		return nil, err
	}
	if err := s.submit(b); err != nil {
		return nil, rpcError(err)
	}
	resp := &nimbusv1.DeleteBatchResponse{Results: make([]*nimbusv1.DeleteResponse, len(b.outcomes)), Revision: b.rev, Transactions: uint32(b.txns)}
	for i, out := range b.outcomes {
		resp.Results[i] = deleteResponse(out)
	}
	return resp, nil
}

// refusal collects what is wrong with the entries of a batch: the lines of the message that
// refuses it, and, for a call that names its entries by position, the same as the field
// violations of an errdetails.BadRequest, one per line, each naming the entry and the
// field in it, `objects[3].spec.prefix`, with the line's text after the position as its
// description. When entries go undescribed, an errdetails.ErrorInfo
// (nimbusv1.BadEntriesReason) says how many entries are bad in all.
type refusal struct {
	lines      []string
	violations []*errdetails.BadRequest_FieldViolation
	// entries is how many bad entries there are; only the first maxReportedInvalid have
	// lines.
	entries int
}

// add records that the entry at position pos (`objects[3]`), whose key ID is id, is bad
// because of err, whose joined errors, such as the field errors of a Validate, each take
// a line. pos is "" for a call that does not name its entries by position, id "" for an
// entry without a key.
func (r *refusal) add(pos, id string, err error) {
	r.entries++
	if r.entries > maxReportedInvalid {
		return
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	at := pos
	if id != "" {
		at += " (" + id + ")"
	}
	for _, e := range errs {
		if pos == "" {
			r.lines = append(r.lines, e.Error())
			continue
		}
		r.lines = append(r.lines, at+": "+e.Error())
		r.violations = append(r.violations, &errdetails.BadRequest_FieldViolation{Field: pos + fieldPath(e), Description: e.Error()})
	}
}

// fieldPath returns the path, from a dot, of the field err is about within its entry:
// ".spec.prefix" for a field error of an object, ".name" for one of a key (whose field
// errors say key.name); "" when err is about the entry as a whole.
func fieldPath(err error) string {
	var (
		fe *nimbusv1.FieldError
		ce *claimError
	)
	switch {
	case errors.As(err, &fe):
		return "." + strings.TrimPrefix(fe.Field, "key.")
	case errors.As(err, &ce):
		return "." + ce.field
	}
	return ""
}

// any tells whether an entry is bad.
func (r *refusal) any() bool { return r.entries > 0 }

// err returns the codes.InvalidArgument status error refusing the batch, or nil when every
// entry is good.
func (r *refusal) err() error {
	if r.entries == 0 {
		return nil
	}
	return r.status(codes.InvalidArgument).Err()
}

// conflictErr returns the error, wrapping ErrConflict, that refuses a batch whose entries
// conflict with other objects, or nil when none does.
func (r *refusal) conflictErr() error {
	if r.entries == 0 {
		return nil
	}
	return &conflictError{msg: r.message(), details: r.details()}
}

// status returns the refusal as a status of the code, with its details.
func (r *refusal) status(code codes.Code) *status.Status {
	return withDetails(status.New(code, r.message()), r.details())
}

// details returns the details a refusal's status carries: the BadRequest of the entries
// named by position, if any, and the ErrorInfo that counts the bad entries when some are
// not described.
func (r *refusal) details() []protoadapt.MessageV1 {
	var out []protoadapt.MessageV1
	if len(r.violations) > 0 {
		out = append(out, &errdetails.BadRequest{FieldViolations: r.violations})
	}
	if r.entries > maxReportedInvalid {
		out = append(out, &errdetails.ErrorInfo{Reason: nimbusv1.BadEntriesReason, Domain: nimbusv1.ErrorDomain,
			Metadata: map[string]string{nimbusv1.BadEntriesKey: strconv.Itoa(r.entries)}})
	}
	return out
}

// withDetails returns st with the details added; st itself when there are none, or when
// they cannot be added.
func withDetails(st *status.Status, details []protoadapt.MessageV1) *status.Status {
	if len(details) == 0 {
		return st
	}
	if d, err := st.WithDetails(details...); err == nil {
		return d
	}
	return st
}

// message is the refusal's lines, and how many bad entries they leave out.
func (r *refusal) message() string {
	msg := strings.Join(r.lines, "\n")
	if more := r.entries - maxReportedInvalid; more > 0 {
		msg += fmt.Sprintf("\n(%d more bad entries not shown)", more)
	}
	return msg
}

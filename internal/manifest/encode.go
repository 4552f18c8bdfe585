package manifest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Format is an encoding Encode and EncodeList write.
type Format string

// The formats Encode and EncodeList write.
const (
	// JSON is JSON indented by two spaces.
	JSON Format = "json"
	// YAML is block-style YAML with sorted keys.
	YAML Format = "yaml"
)

// document is the manifest shape. Its fields are in the order they are written.
type document struct {
	Kind   string          `json:"kind"`
	Meta   json.RawMessage `json:"meta"`
	Spec   json.RawMessage `json:"spec"`
	Status json.RawMessage `json:"status,omitempty"`
}

// list is the shape of several objects: {"items": [...]}.
type list struct {
	Items []json.RawMessage `json:"items"`
}

// Marshal returns obj in manifest shape as compact JSON, with a "status" key holding status
// when status is not nil. Meta, spec and status are in their protobuf JSON mapping
// (camelCase field names, enum value names), but for 64-bit integers, which are JSON
// numbers rather than the strings protojson writes ("generation": 2); both read back.
// Meta and spec hold only the fields that are set, as a person would write them; status
// holds zero counts and empty messages too, so that every node's phase,
// observedGeneration and message are there to read.
func Marshal(obj *nimbusv1.Object, status *nimbusv1.ObjectStatus) (json.RawMessage, error) {
	m := obj.ProtoReflect()
	fd := m.WhichOneof(m.Descriptor().Oneofs().ByName("spec"))
	if fd == nil {
		return nil, fmt.Errorf("encoding object %q: object has no spec", obj.GetMeta().GetName())
	}
	doc := document{Kind: obj.Kind().Name()}
	var err error
	if doc.Meta, err = marshalProto(protojson.MarshalOptions{}, obj.GetMeta()); err != nil {
		return nil, fmt.Errorf("encoding meta of %s: %w", obj.Key().ID(), err)
	}
	if doc.Spec, err = marshalProto(protojson.MarshalOptions{}, m.Get(fd).Message().Interface()); err != nil {
		return nil, fmt.Errorf("encoding spec of %s: %w", obj.Key().ID(), err)
	}
	if status != nil {
		if doc.Status, err = marshalProto(protojson.MarshalOptions{EmitDefaultValues: true}, status); err != nil {
			return nil, fmt.Errorf("encoding status of %s: %w", obj.Key().ID(), err)
		}
	}
	return compactJSON(doc)
}

// Encode writes obj in manifest shape to w, with its status when status is not nil.
func Encode(w io.Writer, f Format, obj *nimbusv1.Object, status *nimbusv1.ObjectStatus) error {
	raw, err := Marshal(obj, status)
	if err != nil {
		return err
	}
	return write(w, f, raw)
}

// EncodeList writes items in manifest shape to w as one document, {"items": [...]}, which
// Decode reads as the list of objects it holds.
func EncodeList(w io.Writer, f Format, items []*nimbusv1.ObjectWithStatus) error {
	raw, err := MarshalList(items)
	if err != nil {
		return err
	}
	return write(w, f, raw)
}

// MarshalList returns items in manifest shape as compact JSON, {"items": [...]}, each as
// Marshal returns it: the document EncodeList writes.
func MarshalList(items []*nimbusv1.ObjectWithStatus) (json.RawMessage, error) {
	l := list{Items: make([]json.RawMessage, 0, len(items))}
	for _, it := range items {
		raw, err := Marshal(it.GetObject(), it.GetStatus())
		if err != nil {
			return nil, err
		}
		l.Items = append(l.Items, raw)
	}
	return compactJSON(l)
}

// write writes the compact JSON raw to w in format f.
func write(w io.Writer, f Format, raw json.RawMessage) error {
	var out []byte
	switch f {
	case JSON:
		var buf bytes.Buffer
		if err := json.Indent(&buf, raw, "", "  "); err != nil {
			return fmt.Errorf("indenting JSON: %w", err)
		}
		buf.WriteByte('\n')
		out = buf.Bytes()
	case YAML:
		var err error
		if out, err = yaml.JSONToYAML(raw); err != nil {
			return fmt.Errorf("converting JSON to YAML: %w", err)
		}
	default:
		return fmt.Errorf("format %q: want %q or %q", f, JSON, YAML)
	}
	if _, err := w.Write(out); err != nil {
		return fmt.Errorf("writing %s: %w", f, err)
	}
	return nil
}

// MarshalMessage returns m in its protobuf JSON mapping as compact JSON, zero values
// included, with 64-bit integers as JSON numbers, as Marshal writes a status: for messages
// shown next to manifests, such as one node's status.
func MarshalMessage(m proto.Message) (json.RawMessage, error) {
	return marshalProto(protojson.MarshalOptions{EmitDefaultValues: true}, m)
}

// MarshalRecord returns m in its protobuf JSON mapping as compact JSON, zero values left
// out, with 64-bit integers as JSON numbers: for records written one a line, such as flow
// records.
func MarshalRecord(m proto.Message) (json.RawMessage, error) {
	return marshalProto(protojson.MarshalOptions{}, m)
}

// marshalProto encodes m with o, compacted (protojson varies its spacing on purpose), with
// its 64-bit integers as JSON numbers (see int64Numbers).
func marshalProto(o protojson.MarshalOptions, m proto.Message) (json.RawMessage, error) {
	b, err := o.Marshal(m)
	if err != nil {
		return nil, err
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, b); err != nil {
		return nil, err
	}
	return int64Numbers(compact.Bytes(), m.ProtoReflect().Descriptor())
}

// compactJSON encodes v without escaping <, > and &, which may appear in messages.
func compactJSON(v any) (json.RawMessage, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("encoding JSON: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

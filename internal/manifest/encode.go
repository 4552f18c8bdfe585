package manifest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
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

// marshalProto encodes m with o, compacted (protojson varies its spacing on purpose), with
// its 64-bit integers as JSON numbers (see int64Numbers).
func marshalProto(o protojson.MarshalOptions, m proto.Message) (json.RawMessage, error) {
	b, err := o.Marshal(m)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := int64Numbers(&buf, b, m.ProtoReflect().Descriptor()); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// int64Numbers writes raw, the protojson encoding of a message of type md, to buf as
// compact JSON, with the values of its 64-bit integer fields (int64, uint64, sint64,
// fixed64, sfixed64), which protojson writes as strings, written as the numbers they
// hold: "generation": 3 rather than "generation": "3". The digits are copied as they are,
// so no precision is lost, however large the value; protojson reads both forms, so the
// manifest still decodes. The order of the fields is kept.
func int64Numbers(buf *bytes.Buffer, raw []byte, md protoreflect.MessageDescriptor) error {
	if isWellKnown(md) {
		return json.Compact(buf, raw) // Timestamp, Duration: strings of their own
	}
	return eachMember(buf, raw, func(key string, value []byte) error {
		fd := md.Fields().ByJSONName(key)
		if fd == nil {
			fd = md.Fields().ByTextName(key)
		}
		if fd == nil {
			return json.Compact(buf, value)
		}
		switch {
		case fd.IsMap():
			return eachMember(buf, value, func(_ string, v []byte) error { return singularNumbers(buf, v, fd.MapValue()) })
		case fd.IsList():
			return eachElement(buf, value, func(v []byte) error { return singularNumbers(buf, v, fd) })
		}
		return singularNumbers(buf, value, fd)
	})
}

// singularNumbers writes raw, the JSON of one value of the field fd (one element of a
// list, one value of a map), to buf as int64Numbers does.
func singularNumbers(buf *bytes.Buffer, raw []byte, fd protoreflect.FieldDescriptor) error {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return int64Numbers(buf, raw, fd.Message())
	case protoreflect.Int64Kind, protoreflect.Uint64Kind, protoreflect.Sint64Kind,
		protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind:
		var s string
		if json.Unmarshal(raw, &s) == nil && isInteger(s) {
			buf.WriteString(s)
			return nil
		}
	}
	return json.Compact(buf, raw)
}

// isInteger reports whether s is a decimal integer as JSON writes one: an optional minus
// sign and digits without leading zeros.
func isInteger(s string) bool {
	digits := strings.TrimPrefix(s, "-")
	if digits == "" || (digits[0] == '0' && len(digits) > 1) {
		return false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return false
		}
	}
	return true
}

// eachMember writes the JSON object raw to buf, compact, calling member to write the
// value of each member after its key. A raw that is not an object is written as it is.
func eachMember(buf *bytes.Buffer, raw []byte, member func(key string, value []byte) error) error {
	var members orderedObject
	if err := json.Unmarshal(raw, &members); err != nil || members == nil {
		return json.Compact(buf, raw)
	}
	buf.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			buf.WriteByte(',')
		}
		key, err := compactJSON(m.key)
		if err != nil {
			return err
		}
		buf.Write(key)
		buf.WriteByte(':')
		if err := member(m.key, m.value); err != nil {
			return err
		}
	}
	buf.WriteByte('}')
	return nil
}

// eachElement writes the JSON array raw to buf, compact, calling element to write each
// element. A raw that is not an array is written as it is.
func eachElement(buf *bytes.Buffer, raw []byte, element func(value []byte) error) error {
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil || elems == nil {
		return json.Compact(buf, raw)
	}
	buf.WriteByte('[')
	for i, e := range elems {
		if i > 0 {
			buf.WriteByte(',')
		}
		if err := element(e); err != nil {
			return err
		}
	}
	buf.WriteByte(']')
	return nil
}

// orderedObject is a JSON object's members in the order they are written.
type orderedObject []member

// member is one member of a JSON object.
type member struct {
	key   string
	value json.RawMessage
}

// UnmarshalJSON reads a JSON object's members in order; null leaves o nil.
func (o *orderedObject) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok == nil {
		return nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("want a JSON object, got %v", tok)
	}
	members := orderedObject{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return err
		}
		members = append(members, member{key: tok.(string), value: value})
	}
	*o = members
	return nil
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

package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
	"sigs.k8s.io/yaml"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// DecodeFile reads every object in the manifest file at path, as Decode does. Its errors
// start with the path.
func DecodeFile(path string) ([]*nimbusv1.Object, error) {
	return decodeFile(path, &decoder{})
}

// DecodeKeysFile reads the manifest file at path as DecodeKeys does. Its errors start with
// the path.
func DecodeKeysFile(path string) ([]*nimbusv1.Object, error) {
	return decodeFile(path, &decoder{keyOnly: true})
}

// decodeFile decodes the manifest file at path with d.
func decodeFile(path string, d *decoder) ([]*nimbusv1.Object, error) {
	// ReadFile reads a file of known size in one read, into a buffer of that size.
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading manifest: %w", err)
	}
	objs, err := decodeBytes(data, d)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return objs, nil
}

// Decode reads every object in r, YAML or JSON, in the order they appear. Empty documents
// are skipped. It stops at the first bad document and returns an error naming it and, where
// known, the field. The objects are not validated.
func Decode(r io.Reader) ([]*nimbusv1.Object, error) {
	return decodeReader(r, &decoder{})
}

// DecodeKeys reads the objects in r as Decode does, but of each only what names it: its
// kind and its meta's tenant, namespace and name, with an empty spec of its kind. The rest
// of a document is not read, so a field that is not known (any longer), or a value its
// field cannot hold, is no error: it is for deleting the objects a manifest names.
func DecodeKeys(r io.Reader) ([]*nimbusv1.Object, error) {
	return decodeReader(r, &decoder{keyOnly: true})
}

// decodeReader decodes what r holds with d.
func decodeReader(r io.Reader, d *decoder) ([]*nimbusv1.Object, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("reading manifest: %w", err)
	}
	return decodeBytes(data, d)
}

// decodeBytes decodes data with d, as Decode does.
func decodeBytes(data []byte, d *decoder) ([]*nimbusv1.Object, error) {
	var err error
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	if isJSON(data) {
		err = d.decodeJSON(data)
	} else {
		err = d.decodeYAML(data)
	}
	if err != nil {
		return nil, err
	}
	return d.objs, nil
}

// decoder collects the objects of one input and counts its documents.
type decoder struct {
	// n is the number of documents seen so far; the one being decoded is document n.
	n int
	// yaml is set when the input is YAML rather than JSON.
	yaml bool
	// general makes every YAML document go through YAMLToJSONStrict, never the fast
	// subset: for the tests that hold the two to the same result.
	general bool
	// keyOnly makes it read of each object only what names it (DecodeKeys).
	keyOnly bool
	objs    []*nimbusv1.Object
}

// isJSON reports whether data starts like JSON rather than YAML.
func isJSON(data []byte) bool {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	return len(trimmed) > 0 && (trimmed[0] == '{' || trimmed[0] == '[')
}

// decodeJSON decodes a stream of JSON values, each an object or an array of objects.
func (d *decoder) decodeJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("document %d: %w", d.n+1, jsonSyntaxError(data, err))
		}
		if err := d.value(raw); err != nil {
			return err
		}
	}
}

// jsonSyntaxError adds the line to a JSON syntax error.
func jsonSyntaxError(data []byte, err error) error {
	var serr *json.SyntaxError
	if errors.As(err, &serr) {
		line := 1 + bytes.Count(data[:min(int(serr.Offset), len(data))], []byte("\n"))
		return fmt.Errorf("invalid JSON at line %d: %w", line, err)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("invalid JSON: unexpected end of input: %w", err)
	}
	return fmt.Errorf("invalid JSON: %w", err)
}

// decodeYAML splits data into YAML documents and decodes each. A document of the fast
// subset that holds one object is made into it directly (directObject), or else through
// its JSON; any other is converted to JSON, and decoded when it holds one object. That is
// done on every core at once, as it is most of the work in a large manifest; documents
// are then counted, and errors reported, in order.
func (d *decoder) decodeYAML(data []byte) error {
	d.yaml = true
	docs := splitYAML(data)
	type converted struct {
		raw []byte
		err error
		// single is set when the document is one object, decoded into obj or failing with
		// objErr; raw is then not kept.
		single bool
		obj    *nimbusv1.Object
		objErr error
	}
	out := make([]converted, len(docs))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(docs)) {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < len(docs); i = int(next.Add(1)) - 1 {
				if docs[i].empty() {
					continue
				}
				c := &out[i]
				if m, ok := simpleYAMLMapping(docs[i].data); ok && !d.general && !isItems(m) {
					if obj, ok := d.directObject(m); ok {
						c.single, c.obj = true, obj
						continue
					}
					if fields, ok := jsonFields(m); ok {
						c.single = true
						c.obj, c.objErr = decodeObject(fields, d.keyOnly)
						continue
					}
				}
				if c.raw, c.err = yaml.YAMLToJSONStrict(docs[i].data); c.err == nil {
					if c.obj, c.single, c.objErr = decodeSingle(c.raw, d.keyOnly); c.single {
						c.raw = nil
					}
				}
			}
		})
	}
	wg.Wait()
	for i, doc := range docs {
		if doc.empty() {
			continue
		}
		c := &out[i]
		if err := c.err; err != nil {
			return fmt.Errorf("document %d: %w", d.n+1, &rewordedError{msg: fileLines(err.Error(), doc.line-1), err: err})
		}
		if c.single {
			d.n++
			if err := d.add(c.obj, c.objErr); err != nil {
				return err
			}
			continue
		}
		if err := d.value(c.raw); err != nil {
			return err
		}
	}
	return nil
}

// directObject makes the object of m, a document of the fast subset, as directObject
// does, unless d reads keys only, which it leaves to decodeObject.
func (d *decoder) directObject(m yamlValue) (*nimbusv1.Object, bool) {
	if d.keyOnly {
		return nil, false
	}
	return directObject(m)
}

// decodeSingle decodes raw when it is one object, as value would: a mapping that is not a
// list of items, whole or only its key (keyOnly). It reports with single whether it was;
// when not, value decodes raw.
func decodeSingle(raw []byte, keyOnly bool) (obj *nimbusv1.Object, single bool, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return nil, false, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, false, nil
	}
	if isItemList(fields) {
		return nil, false, nil
	}
	obj, err = decodeObject(fields, keyOnly)
	return obj, true, err
}

// isItems reports whether a mapping of the fast subset is only "items", a list of
// objects.
func isItems(m yamlValue) bool {
	n, items := 0, false
	for v := range m.values() {
		n++
		items = v.key() == "items"
	}
	return n == 1 && items
}

// isItemList reports whether the fields of a mapping are only "items", a list of objects.
func isItemList(fields map[string]json.RawMessage) bool {
	_, ok := fields["items"]
	return ok && len(fields) == 1
}

// yamlDoc is one YAML document and the line of the file it starts on.
type yamlDoc struct {
	data []byte
	line int
}

// empty reports whether the document holds nothing but blank lines and comments.
func (doc yamlDoc) empty() bool {
	for line := range bytes.Lines(doc.data) {
		line = bytes.TrimSpace(line)
		if len(line) > 0 && line[0] != '#' {
			return false
		}
	}
	return true
}

// splitYAML splits a YAML stream at its "---" document markers. A marker line becomes a
// blank line of the next document, so line and column numbers within a document stay those
// of the file once the document's start line is added. The markers are found by
// searching data, not by reading it line by line, and the documents are views of data:
// nothing else can start before the split is done. Only a document whose marker has more
// on its line is copied, with the marker's three dashes as spaces.
func splitYAML(data []byte) []yamlDoc {
	var docs []yamlDoc
	// The current document starts on line first of the file and at start in data; padded
	// tells that its first line holds more after its marker.
	first, start, padded := 1, 0, false
	// line is the number of the line that starts at data[counted].
	line, counted := 1, 0
	done := func(end int) {
		d := data[start:end:end]
		if padded {
			d = append(append(make([]byte, 0, 3+len(d)), "   "...), d...)
		}
		docs = append(docs, yamlDoc{line: first, data: d})
	}
	marker := []byte("\n---")
	for at := 0; at < len(data); {
		// at is where a line starts.
		if rest, ok := bytes.CutPrefix(data[at:], marker[1:]); ok && (len(rest) == 0 || strings.ContainsRune(" \t\r\n", rune(rest[0]))) {
			done(at)
			line += bytes.Count(data[counted:at], marker[:1])
			counted = at
			first, start = line, at+3
			eol := bytes.IndexByte(rest, '\n')
			if eol < 0 {
				eol = len(rest)
			}
			padded = len(bytes.TrimRight(rest[:eol], "\r")) > 0
		}
		i := bytes.Index(data[at:], marker)
		if i < 0 {
			break
		}
		at += i + 1
	}
	done(len(data))
	return docs
}

// yamlLine matches the line numbers in the YAML parser's messages.
var yamlLine = regexp.MustCompile(`\bline (\d+)\b`)

// fileLines adds offset to every line number in a YAML parser message.
func fileLines(msg string, offset int) string {
	return yamlLine.ReplaceAllStringFunc(msg, func(m string) string {
		n, err := strconv.Atoi(strings.TrimPrefix(m, "line "))
		if err != nil {
			return m
		}
		return "line " + strconv.Itoa(n+offset)
	})
}

// value decodes one JSON value: null is an empty document, an array or a mapping holding
// only "items" is a list of documents, and any other mapping is one object.
func (d *decoder) value(raw json.RawMessage) error {
	raw = bytes.TrimSpace(raw)
	switch {
	case bytes.Equal(raw, []byte("null")):
		return nil
	case len(raw) > 0 && raw[0] == '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return fmt.Errorf("document %d: %w", d.n+1, err)
		}
		for _, item := range items {
			if err := d.value(item); err != nil {
				return err
			}
		}
		return nil
	case len(raw) == 0 || raw[0] != '{':
		d.n++
		return fmt.Errorf("document %d: want a mapping with kind, meta and spec, not %s", d.n, raw)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		d.n++
		return fmt.Errorf("document %d: %w", d.n, err)
	}
	if items, ok := fields["items"]; ok && len(fields) == 1 {
		if t := bytes.TrimSpace(items); len(t) > 0 && t[0] != '[' && !bytes.Equal(t, []byte("null")) {
			d.n++
			return fmt.Errorf("document %d: items: want a list of objects, not %s", d.n, t)
		}
		return d.value(items)
	}
	d.n++
	return d.add(decodeObject(fields, d.keyOnly))
}

// add appends obj, the object of document d.n, or returns err, what decoding it found
// wrong, naming the document.
func (d *decoder) add(obj *nimbusv1.Object, err error) error {
	if err != nil {
		if ve := (*valueError)(nil); d.yaml && errors.As(err, &ve) && ve.boolForString() {
			err = fmt.Errorf("%w (YAML reads unquoted y, yes, on, n, no and off as booleans: quote the value)", err)
		}
		return fmt.Errorf("document %d: %w", d.n, err)
	}
	d.objs = append(d.objs, obj)
	return nil
}

// decodeObject turns the top-level fields of one document into an object. The object always
// carries its kind's spec, empty when the document has none, so that its kind is kept.
// With keyOnly it reads only what names the object (DecodeKeys).
func decodeObject(fields map[string]json.RawMessage, keyOnly bool) (*nimbusv1.Object, error) {
	for _, k := range sortedKeys(fields) {
		switch k {
		case "kind", "meta", "spec", "status":
		default:
			return nil, fmt.Errorf("unknown field %q (want kind, meta and spec)", k)
		}
	}
	rawKind, ok := fields["kind"]
	if !ok || isNull(rawKind) {
		return nil, errors.New("missing kind")
	}
	var name string
	if err := json.Unmarshal(rawKind, &name); err != nil {
		return nil, fmt.Errorf("kind %s: must be a string", rawKind)
	}
	kind, err := nimbusv1.ParseKind(name)
	if err != nil {
		return nil, err
	}
	obj := &nimbusv1.Object{}
	spec, err := setSpec(obj, kind)
	if err != nil {
		return nil, err
	}
	if raw, ok := fields["meta"]; ok && !isNull(raw) {
		obj.Meta = &nimbusv1.ObjectMeta{}
		if keyOnly {
			err = unmarshalKey(raw, obj.Meta)
		} else {
			err = unmarshalField("meta", raw, obj.Meta)
		}
		if err != nil {
			return nil, err
		}
	}
	if raw, ok := fields["spec"]; ok && !isNull(raw) && !keyOnly {
		if err := unmarshalField("spec", raw, spec); err != nil {
			return nil, err
		}
	}
	return obj, nil
}

// setSpec sets the object's spec to an empty spec message of kind and returns it. The spec
// field of a kind is named after the kind: KIND_SECURITY_GROUP's is security_group.
func setSpec(obj *nimbusv1.Object, kind nimbusv1.Kind) (proto.Message, error) {
	m := obj.ProtoReflect()
	fd := kind.SpecField()
	if fd == nil || fd.Message() == nil {
		name := strings.ToLower(strings.TrimPrefix(kind.String(), "KIND_"))
		return nil, fmt.Errorf("kind %q: no spec field %q in nimbus.v1.Object", kind.Name(), name)
	}
	spec := m.NewField(fd)
	m.Set(fd, spec)
	return spec.Message().Interface(), nil
}

// unmarshalField decodes raw, the JSON of the top-level field path, into m. Unknown fields
// are reported with their full path, which protojson does not give: as protojson refuses
// them too, raw is searched for them only when protojson fails.
func unmarshalField(path string, raw json.RawMessage, m proto.Message) error {
	perr := protojson.Unmarshal(raw, m)
	if perr == nil {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := checkFields(path, v, m.ProtoReflect().Descriptor()); err != nil {
		return err
	}
	return &rewordedError{msg: path + ": " + protoMessage(perr), err: perr}
}

// unmarshalKey sets the tenant, namespace and name of meta from raw, the JSON of a
// document's meta, and reads nothing else of it.
func unmarshalKey(raw json.RawMessage, meta *nimbusv1.ObjectMeta) error {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return fmt.Errorf("meta: %w", err)
	}
	fields, ok := v.(map[string]any)
	if !ok {
		return &valueError{path: "meta", value: v, want: "a mapping"}
	}
	for _, f := range []struct {
		name string
		to   *string
	}{{"tenant", &meta.Tenant}, {"namespace", &meta.Namespace}, {"name", &meta.Name}} {
		s, ok := fields[f.name].(string)
		if !ok && fields[f.name] != nil {
			return &valueError{path: "meta." + f.name, value: fields[f.name], want: wantString}
		}
		*f.to = s
	}
	return nil
}

// checkFields reports the first field in v, the JSON form of a message md at path, that md
// does not have, or whose value the field cannot hold (valueError), in key order. It
// accepts what protojson accepts: the JSON (camelCase) name or the .proto name, and for a
// scalar or a well-known type whatever protojson takes for that field alone.
func checkFields(path string, v any, md protoreflect.MessageDescriptor) error {
	obj, ok := v.(map[string]any)
	if !ok {
		return &valueError{path: path, value: v, want: "a mapping"}
	}
	for _, k := range sortedKeys(obj) {
		fd := md.Fields().ByJSONName(k)
		if fd == nil {
			fd = md.Fields().ByTextName(k)
		}
		if fd == nil {
			return fmt.Errorf("%s: unknown field %q", path, k)
		}
		if err := checkField(path+"."+k, obj[k], fd); err != nil {
			return err
		}
	}
	return nil
}

// checkField checks v, the JSON form of field fd at path, as checkFields does. null is
// any field's zero value.
func checkField(path string, v any, fd protoreflect.FieldDescriptor) error {
	switch {
	case v == nil:
		return nil
	case fd.IsMap():
		m, ok := v.(map[string]any)
		if !ok {
			return &valueError{path: path, value: v, want: "a mapping"}
		}
		for _, k := range sortedKeys(m) {
			wrap := func(e any) any { return map[string]any{k: e} }
			if err := checkValue(fmt.Sprintf("%s[%q]", path, k), m[k], fd, fd.MapValue(), wrap); err != nil {
				return err
			}
		}
	case fd.IsList():
		list, ok := v.([]any)
		if !ok {
			return &valueError{path: path, value: v, want: "a list"}
		}
		for i, e := range list {
			if err := checkValue(fmt.Sprintf("%s[%d]", path, i), e, fd, fd, func(e any) any { return []any{e} }); err != nil {
				return err
			}
		}
	default:
		return checkValue(path, v, fd, fd, func(e any) any { return e })
	}
	return nil
}

// checkValue checks v, one value at path of field fd of type vd (fd itself, or the value
// of fd's map): a message's fields as checkFields does, and any other value by having
// protojson decode fd holding it alone, wrap(v).
func checkValue(path string, v any, fd, vd protoreflect.FieldDescriptor, wrap func(any) any) error {
	if md := vd.Message(); md != nil && !isWellKnown(md) {
		return checkFields(path, v, md)
	}
	raw, err := json.Marshal(map[string]any{fd.JSONName(): wrap(v)})
	if err == nil && protojson.Unmarshal(raw, dynamicpb.NewMessage(fd.ContainingMessage())) != nil {
		return &valueError{path: path, value: v, want: wantOf(vd)}
	}
	return nil
}

// valueError is a value in a manifest that its field cannot hold, a word where a number
// belongs or one value where a list does: `meta.nodes "host-a": want a list`.
type valueError struct {
	// path is the field's path, "spec.nexthops[0].weight".
	path string
	// value is the value as decoded from JSON.
	value any
	// want says what the field holds: "a list", "true or false".
	want string
}

// Error names the field, the value and what the field holds.
func (e *valueError) Error() string {
	text, _ := json.Marshal(e.value)
	if len(text) > maxValueText {
		text = append(text[:maxValueText:maxValueText], "..."...)
	}
	return fmt.Sprintf("%s %s: want %s", e.path, text, e.want)
}

// boolForString reports whether the value is a boolean where a string belongs, which in
// YAML is most often an unquoted word such as "no" or "on".
func (e *valueError) boolForString() bool {
	_, isBool := e.value.(bool)
	return isBool && e.want == wantString
}

// maxValueText is how many bytes of a refused value a valueError quotes.
const maxValueText = 64

// wantString is what a valueError wants of a string field.
const wantString = "a string"

// wantOf says what a field of type fd holds, for a valueError.
func wantOf(fd protoreflect.FieldDescriptor) string {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		switch fd.Message().FullName() {
		case "google.protobuf.Duration":
			return `a duration such as "5s"`
		case "google.protobuf.Timestamp":
			return `a time such as "2026-01-02T15:04:05Z"`
		}
		return "a " + string(fd.Message().Name())
	case protoreflect.BoolKind:
		return "true or false"
	case protoreflect.StringKind:
		return wantString
	case protoreflect.BytesKind:
		return "base64"
	case protoreflect.EnumKind:
		values := fd.Enum().Values()
		names := make([]string, values.Len())
		for i := range names {
			names[i] = string(values.Get(i).Name())
		}
		return "one of " + strings.Join(names, ", ")
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return fmt.Sprintf("a whole number from %d to %d", math.MinInt32, math.MaxInt32)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return fmt.Sprintf("a whole number from 0 to %d", uint64(math.MaxUint32))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return fmt.Sprintf("a whole number from %d to %d", math.MinInt64, math.MaxInt64)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return fmt.Sprintf("a whole number from 0 to %d", uint64(math.MaxUint64))
	}
	return "a number"
}

// isWellKnown reports whether md is a google.protobuf type, which protojson maps to JSON
// values of its own (a Timestamp is a string).
func isWellKnown(md protoreflect.MessageDescriptor) bool {
	return strings.HasPrefix(string(md.FullName()), "google.protobuf.")
}

// protoPosition matches the prefix of protojson's messages: "proto: (line 1:15): ". The
// position is in JSON made from the manifest, not in the manifest, so it is dropped.
var protoPosition = regexp.MustCompile(`^proto:[\s\x{00a0}]*(\(line \d+:\d+\):[\s\x{00a0}]*)?`)

// protoMessage returns a protojson error's message without its prefix.
func protoMessage(err error) string {
	return protoPosition.ReplaceAllString(err.Error(), "")
}

// rewordedError is err with its message made readable; err stays in the chain.
type rewordedError struct {
	msg string
	err error
}

// Error returns the reworded message.
func (e *rewordedError) Error() string { return e.msg }

// Unwrap returns the original error.
func (e *rewordedError) Unwrap() error { return e.err }

// isNull reports whether raw is JSON null.
func isNull(raw json.RawMessage) bool {
	return bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// sortedKeys returns the keys of m in order, so that the first error found is always the same.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

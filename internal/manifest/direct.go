package manifest

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/protobuf/reflect/protoreflect"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// directObject builds the object of a document from its mapping as simpleYAMLMapping
// parsed it, straight into the protobuf messages, as decodeObject would from the
// mapping's JSON through protojson, at a fraction of the cost: no JSON is written and
// read again. It takes only what it is sure protojson takes the same way, and reports
// false for anything else, an error included: decodeObject then decodes the document and
// says what is wrong, with its own words. FuzzDecode holds the two to the same objects.
func directObject(m yamlMap) (*nimbusv1.Object, bool) {
	var kindV, metaV, specV any
	for _, p := range m {
		switch p.key {
		case "kind":
			kindV = p.val
		case "meta":
			metaV = p.val
		case "spec":
			specV = p.val
		case "status":
		default:
			return nil, false
		}
	}
	name, ok := kindV.(string)
	if !ok {
		return nil, false
	}
	kind, err := nimbusv1.ParseKind(name)
	if err != nil {
		return nil, false
	}
	obj := &nimbusv1.Object{}
	spec, err := setSpec(obj, kind)
	if err != nil {
		return nil, false
	}
	if metaV != nil {
		meta, ok := metaV.(yamlMap)
		if !ok {
			return nil, false
		}
		obj.Meta = &nimbusv1.ObjectMeta{}
		if !setMessage(obj.Meta.ProtoReflect(), meta) {
			return nil, false
		}
	}
	if specV != nil {
		fields, ok := specV.(yamlMap)
		if !ok || !setMessage(spec.ProtoReflect(), fields) {
			return nil, false
		}
	}
	return obj, true
}

// setMessage sets the fields of msg from a mapping of the subset, as protojson sets
// them from the mapping's JSON: each key names a field by its JSON or its .proto name;
// a field named twice, two fields of one oneof and an unknown name are errors. The
// well-known types, which protojson maps to JSON values of their own, are left to it.
func setMessage(msg protoreflect.Message, m yamlMap) bool {
	md := msg.Descriptor()
	if isWellKnown(md) {
		return false
	}
	fields := md.Fields()
	var seen, oneofs smallSet
	for _, p := range m {
		fd := fields.ByJSONName(p.key)
		if fd == nil {
			fd = fields.ByTextName(p.key)
		}
		if fd == nil || !seen.add(int(fd.Number())) {
			return false
		}
		if od := fd.ContainingOneof(); od != nil && !fd.IsList() && !fd.IsMap() && !oneofs.add(od.Index()) {
			return false
		}
		if !setField(msg, fd, p.val) {
			return false
		}
	}
	return true
}

// smallSet is a set of small non-negative integers, field numbers and oneof indexes: a
// bit each below 64, which is all of them in most messages, and a map above, made only
// when needed.
type smallSet struct {
	low  uint64
	high map[int]bool
}

// add adds n to the set and reports whether it was not there yet.
func (s *smallSet) add(n int) bool {
	if n >= 0 && n < 64 {
		had := s.low&(1<<n) != 0
		s.low |= 1 << n
		return !had
	}
	if s.high[n] {
		return false
	}
	if s.high == nil {
		s.high = map[int]bool{}
	}
	s.high[n] = true
	return true
}

// setField sets field fd of msg from v, a value of the subset.
func setField(msg protoreflect.Message, fd protoreflect.FieldDescriptor, v any) bool {
	switch {
	case fd.IsList():
		items, ok := v.([]any)
		if !ok {
			return false
		}
		if fd.Kind() == protoreflect.StringKind {
			if p := goField[[]string](msg, fd); p != nil {
				return appendStrings(p, items)
			}
		}
		list := msg.Mutable(fd).List()
		for _, item := range items {
			if fd.Message() != nil {
				elem := list.NewElement()
				fields, ok := item.(yamlMap)
				if !ok || !setMessage(elem.Message(), fields) {
					return false
				}
				list.Append(elem)
				continue
			}
			val, ok := scalarValue(fd, item)
			if !ok {
				return false
			}
			list.Append(val)
		}
		return true
	case fd.IsMap():
		entries, ok := v.(yamlMap)
		if !ok || fd.MapKey().Kind() != protoreflect.StringKind {
			return false
		}
		vd := fd.MapValue()
		if vd.Kind() == protoreflect.StringKind {
			if p := goField[map[string]string](msg, fd); p != nil {
				return putStrings(p, entries)
			}
		}
		mp := msg.Mutable(fd).Map()
		for _, e := range entries {
			if vd.Message() != nil {
				val := mp.NewValue()
				fields, ok := e.val.(yamlMap)
				if !ok || !setMessage(val.Message(), fields) {
					return false
				}
				mp.Set(protoreflect.ValueOfString(e.key).MapKey(), val)
				continue
			}
			val, ok := scalarValue(vd, e.val)
			if !ok {
				return false
			}
			mp.Set(protoreflect.ValueOfString(e.key).MapKey(), val)
		}
		return true
	case fd.Message() != nil:
		fields, ok := v.(yamlMap)
		if !ok {
			return false
		}
		val := msg.NewField(fd)
		if !setMessage(val.Message(), fields) {
			return false
		}
		msg.Set(fd, val)
		return true
	case fd.Kind() == protoreflect.StringKind:
		if p := goField[string](msg, fd); p != nil {
			s, ok := v.(string)
			*p = s
			return ok
		}
	}
	val, ok := scalarValue(fd, v)
	if !ok {
		return false
	}
	msg.Set(fd, val)
	return true
}

// Strings, lists of strings and maps of strings to strings, the fields of most objects,
// are set in the Go fields of the generated messages: through protoreflect, each string
// is boxed twice, two thirds of what decoding a route allocated.

// goField returns the Go field of msg, a generated message, that holds field fd, when
// its Go type is T; nil when msg is not a generated message or the field is of another
// type, as a field with presence or in a oneof is.
func goField[T any](msg protoreflect.Message, fd protoreflect.FieldDescriptor) *T {
	rv := reflect.ValueOf(msg.Interface())
	if rv.Kind() != reflect.Pointer || rv.Elem().Kind() != reflect.Struct {
		return nil
	}
	i, ok := goFieldIndexes(rv.Type().Elem())[fd.Number()]
	if !ok {
		return nil
	}
	p, _ := rv.Elem().Field(i).Addr().Interface().(*T)
	return p
}

// goFieldCache holds goFieldIndexes's answers, by the struct's type.
var goFieldCache sync.Map

// goFieldIndexes returns the index in t, the struct of a generated message, of the Go
// field of each field number, as its protobuf tag ("bytes,2,rep,name=labels,proto3")
// gives it. A oneof's fields have none.
func goFieldIndexes(t reflect.Type) map[protoreflect.FieldNumber]int {
	if m, ok := goFieldCache.Load(t); ok {
		return m.(map[protoreflect.FieldNumber]int)
	}
	m := map[protoreflect.FieldNumber]int{}
	for i := range t.NumField() {
		parts := strings.Split(t.Field(i).Tag.Get("protobuf"), ",")
		if len(parts) < 2 {
			continue
		}
		if n, err := strconv.Atoi(parts[1]); err == nil {
			m[protoreflect.FieldNumber(n)] = i
		}
	}
	goFieldCache.Store(t, m)
	return m
}

// appendStrings appends items, which must all be strings, to the list at p.
func appendStrings(p *[]string, items []any) bool {
	if len(items) > 0 {
		*p = make([]string, 0, len(items))
	}
	for _, item := range items {
		s, ok := item.(string)
		if !ok {
			return false
		}
		*p = append(*p, s)
	}
	return true
}

// putStrings puts entries, whose values must all be strings, in the map at p.
func putStrings(p *map[string]string, entries yamlMap) bool {
	if *p == nil {
		*p = make(map[string]string, len(entries))
	}
	for _, e := range entries {
		s, ok := e.val.(string)
		if !ok {
			return false
		}
		(*p)[e.key] = s
	}
	return true
}

// scalarValue returns the value of a field of a scalar kind from v, a value of the subset:
// a string for a string, a decimal integer in range for an integer, a value's name or an
// int32 for an enum. Booleans, bytes and floating point are left to protojson, and so are
// integers written as strings.
func scalarValue(fd protoreflect.FieldDescriptor, v any) (protoreflect.Value, bool) {
	switch fd.Kind() {
	case protoreflect.StringKind:
		if s, ok := v.(string); ok {
			return protoreflect.ValueOfString(s), true
		}
	case protoreflect.EnumKind:
		switch v := v.(type) {
		case string:
			if ev := fd.Enum().Values().ByName(protoreflect.Name(v)); ev != nil {
				return protoreflect.ValueOfEnum(ev.Number()), true
			}
		case json.Number:
			if n, ok := parseInt(v, 32); ok {
				return protoreflect.ValueOfEnum(protoreflect.EnumNumber(n)), true
			}
		}
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		if n, ok := v.(json.Number); ok {
			if x, ok := parseInt(n, 32); ok {
				return protoreflect.ValueOfInt32(int32(x)), true
			}
		}
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		if n, ok := v.(json.Number); ok {
			if x, ok := parseInt(n, 64); ok {
				return protoreflect.ValueOfInt64(x), true
			}
		}
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		if n, ok := v.(json.Number); ok {
			if x, err := strconv.ParseUint(string(n), 10, 32); err == nil && strconv.FormatUint(x, 10) == string(n) {
				return protoreflect.ValueOfUint32(uint32(x)), true
			}
		}
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		if n, ok := v.(json.Number); ok {
			if x, err := strconv.ParseUint(string(n), 10, 64); err == nil && strconv.FormatUint(x, 10) == string(n) {
				return protoreflect.ValueOfUint64(x), true
			}
		}
	}
	return protoreflect.Value{}, false
}

// parseInt parses n as a decimal integer of bits bits written in its shortest form, which
// protojson reads as that integer.
func parseInt(n json.Number, bits int) (int64, bool) {
	x, err := strconv.ParseInt(string(n), 10, bits)
	return x, err == nil && strconv.FormatInt(x, 10) == string(n)
}

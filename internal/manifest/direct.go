package manifest

import (
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// directObject builds the object of a document from its mapping as simpleYAMLMapping
// parsed it, straight into the protobuf messages, as decodeObject would from the
// mapping's JSON through protojson, at a fraction of the cost: no JSON is written and
// read again. It takes only what it is sure protojson takes the same way, and reports
// false for anything else, an error included: decodeObject then decodes the document and
// says what is wrong, with its own words. FuzzDecode holds the two to the same objects.
func directObject(m yamlValue) (*nimbusv1.Object, bool) {
	var kindV, metaV, specV yamlValue
	for v := range m.values() {
		switch v.key() {
		case "kind":
			kindV = v
		case "meta":
			metaV = v
		case "spec":
			specV = v
		case "status":
		default:
			return nil, false
		}
	}
	if kindV.kind() != yamlString {
		return nil, false
	}
	kind, ok := parseKind(kindV.text())
	if !ok {
		return nil, false
	}
	// The object with its kind's empty spec, as setSpec makes it, and an empty meta, made
	// by ObjectKey.Skeleton without the reflection setSpec goes through to set a oneof,
	// which was a tenth of the cost of a route. The meta goes again when the document has
	// none.
	key := nimbusv1.ObjectKey{Kind: kind}
	obj := key.Skeleton(0)
	specType := specTypes()[kind]
	if specType == nil || obj.Kind() != kind {
		return nil, false
	}
	if metaV.kind() == noValue {
		obj.Meta = nil
	} else if metaV.kind() != yamlMapping || !metaType().set(reflect.ValueOf(obj.Meta).Elem(), nil, metaV) {
		return nil, false
	}
	if specV.kind() != noValue {
		if specV.kind() != yamlMapping || !specType.set(specStruct(obj), nil, specV) {
			return nil, false
		}
	}
	return obj, true
}

// metaType is the messageType of ObjectMeta.
var metaType = sync.OnceValue(func() *messageType {
	return messageTypeOf((&nimbusv1.ObjectMeta{}).ProtoReflect().Descriptor(), reflect.TypeFor[nimbusv1.ObjectMeta]())
})

// specTypes maps every kind to the messageType of its spec, whose Go struct specStruct
// finds in an object of the kind as ObjectKey.Skeleton makes it.
var specTypes = sync.OnceValue(func() map[nimbusv1.Kind]*messageType {
	m := map[nimbusv1.Kind]*messageType{}
	for _, kind := range nimbusv1.Kinds() {
		key := nimbusv1.ObjectKey{Kind: kind}
		obj := key.Skeleton(0)
		fd := kind.SpecField()
		if fd == nil || obj.Kind() != kind || reflect.ValueOf(obj.Spec).Elem().NumField() != 1 {
			continue // left to decodeObject
		}
		spec := obj.ProtoReflect().Get(fd).Message()
		if spec.Descriptor() != fd.Message() || spec.Interface() != specStruct(obj).Addr().Interface() {
			continue
		}
		m[kind] = messageTypeOf(fd.Message(), specStruct(obj).Type())
	}
	return m
})

// specStruct returns the Go struct of obj's spec. The spec oneof holds it in a wrapper
// of one field (*nimbusv1.Object_Route, whose Route is the *RouteSpec), which is read
// here with package reflect rather than protoreflect, which costs more than setting a
// route's spec's fields.
func specStruct(obj *nimbusv1.Object) reflect.Value {
	return reflect.ValueOf(obj.Spec).Elem().Field(0).Elem()
}

// parseKind reads a kind's name as nimbusv1.ParseKind does, which lowers and trims it
// and drops its separators before looking it up, at a cost that shows in a bulk apply.
// Manifests mostly spell a kind as its name, "Route", which is looked up as written
// first; kindsByName holds what ParseKind reads each such name as.
func parseKind(name string) (nimbusv1.Kind, bool) {
	if kind, ok := kindsByName()[name]; ok {
		return kind, true
	}
	kind, err := nimbusv1.ParseKind(name)
	return kind, err == nil
}

// kindsByName maps the name of every kind, "Route", to the kind ParseKind reads it as.
var kindsByName = sync.OnceValue(func() map[string]nimbusv1.Kind {
	m := map[string]nimbusv1.Kind{}
	for n := range nimbusv1.Kind_name {
		name := nimbusv1.Kind(n).Name()
		if kind, err := nimbusv1.ParseKind(name); err == nil {
			m[name] = kind
		}
	}
	return m
})

// setMessage sets the fields of msg from a mapping of the subset, as protojson sets
// them from the mapping's JSON: each key names a field by its JSON or its .proto name;
// a field named twice, two fields of one oneof and an unknown name are errors. The
// well-known types, which protojson maps to JSON values of their own, are left to it.
func setMessage(msg protoreflect.Message, m yamlValue) bool {
	var (
		goStruct reflect.Value
		goType   reflect.Type
	)
	if rv := reflect.ValueOf(msg.Interface()); rv.Kind() == reflect.Pointer && rv.Elem().Kind() == reflect.Struct {
		goStruct, goType = rv.Elem(), rv.Elem().Type()
	}
	return messageTypeOf(msg.Descriptor(), goType).set(goStruct, msg, m)
}

// A generated message is a Go struct, with a Go field of its own for each field that is
// not in a oneof. Through protoreflect, setting a field costs an interface value (and for
// a string or a message an allocation) in each direction, and a message made for a list
// or a field is made by reflection anyway; most fields of the objects (strings, integers,
// enums, messages, lists of strings and of messages, maps of strings to strings) are so
// set in their Go fields, through package reflect, with what each field needs worked out
// once for each message type (messageType). Any other field, a field with presence or in
// a oneof, and every field of a message that is not generated go through protoreflect.

// messageType is what setting the fields of a message of one type from a mapping needs
// to know of it, worked out once for the type (messageTypeOf).
type messageType struct {
	// wellKnown is set for a google.protobuf type, which protojson maps to JSON values of
	// its own.
	wellKnown bool
	// fields holds each name a key may give a field, its JSON name and its .proto name,
	// with the field protojson finds by it: the field of that JSON name, or else the one
	// of that .proto name.
	fields map[string]*fieldType
}

// fieldType is what setting a field needs to know of it.
type fieldType struct {
	fd protoreflect.FieldDescriptor
	// number is the field's number; oneof the index of its oneof in its message, or -1
	// when it is in none, or is a list or a map, which protojson does not count as
	// setting the oneof.
	number, oneof int
	// set says how the field is set in its Go field, whose index in the message's struct
	// is goField; viaProtoreflect when it is not.
	set     goSetter
	goField int
	// goMessage is the Go type of the message a message field or a list of messages
	// holds, a pointer to its struct; elem is that message's messageType, found on first
	// use, as a message type may hold itself.
	goMessage reflect.Type
	elem      atomic.Pointer[messageType]
}

// goSetter is how a field is set in its Go field.
type goSetter uint8

const (
	viaProtoreflect goSetter = iota
	setString
	setInt  // int32, sint32, sfixed32, int64, sint64, sfixed64
	setUint // uint32, fixed32, uint64, fixed64
	setEnum
	setMessageField
	setStrings
	setMessages
	setStringMap
)

// messageKey identifies a message type: its descriptor, and the Go struct of its
// messages, nil when they are not Go structs. Messages of one descriptor may be
// generated or dynamic (dynamicpb), and dynamic messages of every descriptor share one
// struct.
type messageKey struct {
	desc     protoreflect.MessageDescriptor
	goStruct reflect.Type
}

// messageTypes holds messageTypeOf's answers, by messageKey.
var messageTypes sync.Map

// messageTypeOf returns the messageType of the messages of md whose Go struct is
// goStruct, nil when they are not Go structs.
func messageTypeOf(md protoreflect.MessageDescriptor, goStruct reflect.Type) *messageType {
	key := messageKey{md, goStruct}
	if mt, ok := messageTypes.Load(key); ok {
		return mt.(*messageType)
	}
	mt := &messageType{wellKnown: isWellKnown(md), fields: map[string]*fieldType{}}
	var goFields map[protoreflect.FieldNumber]int
	if goStruct != nil {
		goFields = goFieldIndexes(goStruct)
	}
	fields := md.Fields()
	byNumber := map[protoreflect.FieldNumber]*fieldType{}
	for i := range fields.Len() {
		for _, name := range []string{fields.Get(i).JSONName(), fields.Get(i).TextName()} {
			fd := fields.ByJSONName(name)
			if fd == nil {
				fd = fields.ByTextName(name)
			}
			ft := byNumber[fd.Number()]
			if ft == nil {
				ft = newFieldType(fd, goStruct, goFields)
				byNumber[fd.Number()] = ft
			}
			mt.fields[name] = ft
		}
	}
	actual, _ := messageTypes.LoadOrStore(key, mt)
	return actual.(*messageType)
}

// newFieldType works out how field fd of the messages whose Go struct is goStruct
// (nil when they are not Go structs) is set; goFields are the indexes of the struct's
// fields by number.
func newFieldType(fd protoreflect.FieldDescriptor, goStruct reflect.Type, goFields map[protoreflect.FieldNumber]int) *fieldType {
	ft := &fieldType{fd: fd, number: int(fd.Number()), oneof: -1}
	if od := fd.ContainingOneof(); od != nil && !fd.IsList() && !fd.IsMap() {
		ft.oneof = od.Index()
	}
	i, ok := goFields[fd.Number()]
	if !ok {
		return ft
	}
	goType := goStruct.Field(i).Type
	isMessage := func(t reflect.Type) bool {
		return t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct
	}
	switch {
	case fd.IsMap():
		if fd.MapKey().Kind() == protoreflect.StringKind && fd.MapValue().Kind() == protoreflect.StringKind &&
			goType == reflect.TypeFor[map[string]string]() {
			ft.set = setStringMap
		}
	case fd.IsList():
		switch {
		case fd.Kind() == protoreflect.StringKind && goType == reflect.TypeFor[[]string]():
			ft.set = setStrings
		case fd.Message() != nil && goType.Kind() == reflect.Slice && isMessage(goType.Elem()):
			ft.set, ft.goMessage = setMessages, goType.Elem()
		}
	case fd.Message() != nil:
		if isMessage(goType) {
			ft.set, ft.goMessage = setMessageField, goType
		}
	default:
		ft.set = scalarSetter(fd.Kind(), goType.Kind())
	}
	if ft.set != viaProtoreflect {
		ft.goField = i
	}
	return ft
}

// scalarSetter returns how a field of a scalar kind is set in a Go field of goKind. It
// is viaProtoreflect when the Go field is not the one protobuf generates for the kind
// without presence (a field with presence is a pointer), and for the kinds setField takes
// no value for (booleans, bytes, floating point), which scalarValue then refuses.
func scalarSetter(kind protoreflect.Kind, goKind reflect.Kind) goSetter {
	switch kind {
	case protoreflect.StringKind:
		if goKind == reflect.String {
			return setString
		}
	case protoreflect.EnumKind:
		if goKind == reflect.Int32 {
			return setEnum
		}
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		if goKind == reflect.Int32 {
			return setInt
		}
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		if goKind == reflect.Int64 {
			return setInt
		}
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		if goKind == reflect.Uint32 {
			return setUint
		}
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		if goKind == reflect.Uint64 {
			return setUint
		}
	}
	return viaProtoreflect
}

// elemType returns the messageType of the message a message field or a list of messages
// holds.
func (ft *fieldType) elemType() *messageType {
	if mt := ft.elem.Load(); mt != nil {
		return mt
	}
	mt := messageTypeOf(ft.fd.Message(), ft.goMessage.Elem())
	ft.elem.Store(mt)
	return mt
}

// set sets the fields of a message of the type from a mapping of the subset, as
// setMessage does. goStruct is the message's Go struct, or not valid when it is not one;
// msg is the message through protoreflect, or nil, for it to be found when a field needs
// it.
func (mt *messageType) set(goStruct reflect.Value, msg protoreflect.Message, m yamlValue) bool {
	if mt.wellKnown {
		return false
	}
	var seen, oneofs smallSet
	for v := range m.values() {
		ft := mt.fields[v.key()]
		if ft == nil || !seen.add(ft.number) {
			return false
		}
		if ft.oneof >= 0 && !oneofs.add(ft.oneof) {
			return false
		}
		if ft.set != viaProtoreflect {
			if !ft.setGo(goStruct.Field(ft.goField), v) {
				return false
			}
			continue
		}
		if msg == nil {
			msg = goStruct.Addr().Interface().(proto.Message).ProtoReflect()
		}
		if !setField(msg, ft.fd, v) {
			return false
		}
	}
	return true
}

// setGo sets field, the Go field of the field, from v, a value of the subset, as setField
// would through protoreflect.
func (ft *fieldType) setGo(field reflect.Value, v yamlValue) bool {
	switch ft.set {
	case setString:
		if v.kind() != yamlString {
			return false
		}
		field.SetString(v.text())
	case setInt, setUint, setEnum:
		val, ok := scalarValue(ft.fd, v)
		if !ok {
			return false
		}
		switch ft.set {
		case setInt:
			field.SetInt(val.Int())
		case setUint:
			field.SetUint(val.Uint())
		default:
			field.SetInt(int64(val.Enum()))
		}
	case setMessageField:
		if v.kind() != yamlMapping {
			return false
		}
		p := reflect.New(ft.goMessage.Elem())
		if !ft.elemType().set(p.Elem(), nil, v) {
			return false
		}
		field.Set(p)
	case setStrings:
		return v.kind() == yamlSeq && appendStrings(field.Addr().Interface().(*[]string), v)
	case setMessages:
		if v.kind() != yamlSeq {
			return false
		}
		n := v.count()
		if n == 0 {
			// Left nil, as protoreflect leaves a list nothing is appended to.
			return true
		}
		list := reflect.MakeSlice(field.Type(), n, n)
		elem := ft.elemType()
		i := 0
		for item := range v.values() {
			p := reflect.New(ft.goMessage.Elem())
			if item.kind() != yamlMapping || !elem.set(p.Elem(), nil, item) {
				return false
			}
			list.Index(i).Set(p)
			i++
		}
		field.Set(list)
	case setStringMap:
		return v.kind() == yamlMapping && putStrings(field.Addr().Interface().(*map[string]string), v)
	default:
		return false
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

// setField sets field fd of msg from v, a value of the subset, through protoreflect.
func setField(msg protoreflect.Message, fd protoreflect.FieldDescriptor, v yamlValue) bool {
	switch {
	case fd.IsList():
		if v.kind() != yamlSeq {
			return false
		}
		list := msg.Mutable(fd).List()
		for item := range v.values() {
			if fd.Message() != nil {
				elem := list.NewElement()
				if item.kind() != yamlMapping || !setMessage(elem.Message(), item) {
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
		if v.kind() != yamlMapping || fd.MapKey().Kind() != protoreflect.StringKind {
			return false
		}
		vd := fd.MapValue()
		mp := msg.Mutable(fd).Map()
		for e := range v.values() {
			if vd.Message() != nil {
				val := mp.NewValue()
				if e.kind() != yamlMapping || !setMessage(val.Message(), e) {
					return false
				}
				mp.Set(protoreflect.ValueOfString(e.key()).MapKey(), val)
				continue
			}
			val, ok := scalarValue(vd, e)
			if !ok {
				return false
			}
			mp.Set(protoreflect.ValueOfString(e.key()).MapKey(), val)
		}
		return true
	case fd.Message() != nil:
		if v.kind() != yamlMapping {
			return false
		}
		val := msg.NewField(fd)
		if !setMessage(val.Message(), v) {
			return false
		}
		msg.Set(fd, val)
		return true
	}
	val, ok := scalarValue(fd, v)
	if !ok {
		return false
	}
	msg.Set(fd, val)
	return true
}

// goFieldIndexes returns the index in t, the struct of a generated message, of the Go
// field of each field number, as its protobuf tag ("bytes,2,rep,name=labels,proto3")
// gives it. A oneof's fields have none.
func goFieldIndexes(t reflect.Type) map[protoreflect.FieldNumber]int {
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
	return m
}

// appendStrings sets the list at p to items, which must all be strings.
func appendStrings(p *[]string, items yamlValue) bool {
	if n := items.count(); n > 0 {
		*p = make([]string, 0, n)
	}
	for item := range items.values() {
		if item.kind() != yamlString {
			return false
		}
		*p = append(*p, item.text())
	}
	return true
}

// putStrings puts entries, whose values must all be strings, in the map at p.
func putStrings(p *map[string]string, entries yamlValue) bool {
	if *p == nil {
		*p = make(map[string]string, entries.count())
	}
	for e := range entries.values() {
		if e.kind() != yamlString {
			return false
		}
		(*p)[e.key()] = e.text()
	}
	return true
}

// scalarValue returns the value of a field of a scalar kind from v, a value of the subset:
// a string for a string, a decimal integer in range for an integer, a value's name or an
// int32 for an enum. Booleans, bytes and floating point are left to protojson, and so are
// integers written as strings.
func scalarValue(fd protoreflect.FieldDescriptor, v yamlValue) (protoreflect.Value, bool) {
	switch fd.Kind() {
	case protoreflect.StringKind:
		if v.kind() == yamlString {
			return protoreflect.ValueOfString(v.text()), true
		}
	case protoreflect.EnumKind:
		switch v.kind() {
		case yamlString:
			if ev := fd.Enum().Values().ByName(protoreflect.Name(v.text())); ev != nil {
				return protoreflect.ValueOfEnum(ev.Number()), true
			}
		case yamlInt:
			if n, ok := parseInt(v.text(), 32); ok {
				return protoreflect.ValueOfEnum(protoreflect.EnumNumber(n)), true
			}
		}
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		if v.kind() == yamlInt {
			if x, ok := parseInt(v.text(), 32); ok {
				return protoreflect.ValueOfInt32(int32(x)), true
			}
		}
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		if v.kind() == yamlInt {
			if x, ok := parseInt(v.text(), 64); ok {
				return protoreflect.ValueOfInt64(x), true
			}
		}
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		if v.kind() == yamlInt {
			if x, ok := parseUint(v.text(), 32); ok {
				return protoreflect.ValueOfUint32(uint32(x)), true
			}
		}
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		if v.kind() == yamlInt {
			if x, ok := parseUint(v.text(), 64); ok {
				return protoreflect.ValueOfUint64(x), true
			}
		}
	}
	return protoreflect.Value{}, false
}

// parseInt parses n as a decimal integer of bits bits written in its shortest form, which
// protojson reads as that integer. The shortest form is written into an array on the
// stack to be compared, not into a string of its own.
func parseInt(n string, bits int) (int64, bool) {
	x, err := strconv.ParseInt(n, 10, bits)
	var buf [24]byte
	return x, err == nil && string(strconv.AppendInt(buf[:0], x, 10)) == n
}

// parseUint parses n as an unsigned decimal integer of bits bits written in its shortest
// form, as parseInt does.
func parseUint(n string, bits int) (uint64, bool) {
	x, err := strconv.ParseUint(n, 10, bits)
	var buf [24]byte
	return x, err == nil && string(strconv.AppendUint(buf[:0], x, 10)) == n
}

package codec

import (
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// maxDepth bounds how deep checkUTF8 follows nested messages, as proto.Unmarshal's
// default RecursionLimit bounds its decoding.
const maxDepth = 10000

// maxDenseField is the largest field number a utf8Plan indexes by number; a message
// with larger ones is planned with a map.
const maxDenseField = 1024

// errDepth is returned by checkUTF8 for messages nested deeper than maxDepth.
var errDepth = errors.New("exceeded maximum recursion depth")

// checkUTF8 returns an error when b, the wire form of a message of type md, holds a
// string field that proto.Unmarshal checks (a proto3 string, or one whose edition
// features ask for validation) and that is not valid UTF-8, or when b is not well formed.
// It reads b once and allocates nothing once md has been planned.
func checkUTF8(b []byte, md protoreflect.MessageDescriptor) error {
	return planOf(md).check(b, maxDepth)
}

// A utf8Plan tells, for each field of one message type, what checkUTF8 does with it:
// the descriptors' lookups, made once, would cost more than the check itself.
type utf8Plan struct {
	md protoreflect.MessageDescriptor
	// dense holds the fields by number when none is above maxDenseField; sparse holds
	// them otherwise. Fields that need nothing are left out (the zero fieldPlan).
	dense  []fieldPlan
	sparse map[protowire.Number]fieldPlan
}

// fieldPlan is what checkUTF8 does with one field.
type fieldPlan struct {
	fd protoreflect.FieldDescriptor
	// utf8 is set for a string field whose value must be UTF-8.
	utf8 bool
	// msg is set for a message or group field (map fields included: their entries are
	// messages): its value is checked as a message of that type.
	msg *utf8Plan
}

// plans caches the plan of every message type checkUTF8 has seen, by descriptor. Plans
// are derived from descriptors, which never change, and never change once built.
var plans sync.Map // protoreflect.MessageDescriptor → *utf8Plan

// planOf returns md's plan, building it and those of the messages it holds the first
// time.
func planOf(md protoreflect.MessageDescriptor) *utf8Plan {
	if p, ok := plans.Load(md); ok {
		return p.(*utf8Plan)
	}
	p := buildPlan(md, map[protoreflect.MessageDescriptor]*utf8Plan{})
	actual, _ := plans.LoadOrStore(md, p)
	return actual.(*utf8Plan)
}

// buildPlan builds md's plan; building holds the plans under construction, so that a
// message type that holds itself gets one plan.
func buildPlan(md protoreflect.MessageDescriptor, building map[protoreflect.MessageDescriptor]*utf8Plan) *utf8Plan {
	if p, ok := building[md]; ok {
		return p
	}
	if p, ok := plans.Load(md); ok {
		return p.(*utf8Plan)
	}
	p := &utf8Plan{md: md}
	building[md] = p
	fields := md.Fields()
	maxNum := protowire.Number(0)
	for i := range fields.Len() {
		maxNum = max(maxNum, fields.Get(i).Number())
	}
	if maxNum <= maxDenseField {
		p.dense = make([]fieldPlan, maxNum+1)
	} else {
		p.sparse = map[protowire.Number]fieldPlan{}
	}
	for i := range fields.Len() {
		fd := fields.Get(i)
		var fp fieldPlan
		switch {
		case fd.Kind() == protoreflect.StringKind && enforceUTF8(fd):
			fp = fieldPlan{fd: fd, utf8: true}
		case fd.Message() != nil:
			fp = fieldPlan{fd: fd, msg: buildPlan(fd.Message(), building)}
		default:
			continue
		}
		if p.dense != nil {
			p.dense[fd.Number()] = fp
		} else {
			p.sparse[fd.Number()] = fp
		}
	}
	return p
}

// field returns the plan of field num.
func (p *utf8Plan) field(num protowire.Number) fieldPlan {
	if p.dense != nil {
		if int(num) < len(p.dense) {
			return p.dense[num]
		}
		return fieldPlan{}
	}
	return p.sparse[num]
}

// check checks b, the wire form of a message of p's type, following nested messages
// down to depth levels.
func (p *utf8Plan) check(b []byte, depth int) error {
	if depth == 0 {
		return errDepth
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var fp fieldPlan
		if typ == protowire.BytesType || typ == protowire.StartGroupType {
			fp = p.field(num)
		}
		switch {
		case typ == protowire.BytesType && (fp.utf8 || fp.msg != nil):
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			if fp.utf8 && !utf8.Valid(v) {
				return fmt.Errorf("field %s: string is not valid UTF-8", fp.fd.FullName())
			}
			if fp.msg != nil {
				if err := fp.msg.check(v, depth-1); err != nil {
					return err
				}
			}
		case typ == protowire.StartGroupType && fp.msg != nil:
			v, n := protowire.ConsumeGroup(num, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			if err := fp.msg.check(v, depth-1); err != nil {
				return err
			}
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return nil
}

// enforceUTF8 reports whether proto.Unmarshal checks that the string field fd is UTF-8:
// the descriptors of generated code say so themselves; otherwise proto3 strings are
// checked.
func enforceUTF8(fd protoreflect.FieldDescriptor) bool {
	if e, ok := fd.(interface{ EnforceUTF8() bool }); ok {
		return e.EnforceUTF8()
	}
	return fd.ParentFile().Syntax() == protoreflect.Proto3
}

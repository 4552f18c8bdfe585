package manifest

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// int64Numbers returns raw, the compact protojson encoding of a message of type md, with
// the values of its 64-bit integer fields (int64, uint64, sint64, fixed64, sfixed64),
// which protojson writes as strings, written as the numbers they hold: "generation": 3
// rather than "generation": "3". The digits are copied as they are, so no precision is
// lost, however large the value; protojson reads both forms, so the manifest still
// decodes. Everything else, the order of the fields included, is kept. It is one pass
// over raw, guided by the descriptors: as cheap as copying it.
func int64Numbers(raw []byte, md protoreflect.MessageDescriptor) ([]byte, error) {
	r := &numberRewriter{in: raw, out: make([]byte, 0, len(raw))}
	if err := r.message(md); err != nil {
		return nil, fmt.Errorf("writing 64-bit integers as numbers: %w", err)
	}
	if r.pos != len(raw) {
		return nil, fmt.Errorf("writing 64-bit integers as numbers: %w at offset %d", errBadJSON, r.pos)
	}
	return r.out, nil
}

// errBadJSON is the error of a numberRewriter given what is not compact JSON.
var errBadJSON = errors.New("unexpected JSON")

// numberRewriter copies compact JSON from in to out, value by value, writing the strings
// that hold 64-bit integers as numbers.
type numberRewriter struct {
	in  []byte
	pos int
	out []byte
}

// message copies the value at pos, a message of type md.
func (r *numberRewriter) message(md protoreflect.MessageDescriptor) error {
	if isWellKnown(md) || r.peek() != '{' {
		return r.copyValue() // Timestamp, Duration: strings of their own
	}
	return r.object(func(key []byte) error {
		name := string(key[1 : len(key)-1]) // protojson's field names need no escapes
		fd := md.Fields().ByJSONName(name)
		if fd == nil {
			fd = md.Fields().ByTextName(name)
		}
		if fd == nil {
			return r.copyValue()
		}
		return r.field(fd)
	})
}

// field copies the value at pos, that of the field fd: a map, a list or a single value.
func (r *numberRewriter) field(fd protoreflect.FieldDescriptor) error {
	switch {
	case fd.IsMap() && r.peek() == '{':
		return r.object(func([]byte) error { return r.singular(fd.MapValue()) })
	case fd.IsList() && r.peek() == '[':
		return r.container(']', func() error { return r.singular(fd) })
	}
	return r.singular(fd)
}

// singular copies the value at pos, one value of the field fd (an element of a list, a
// value of a map): a message is walked, a 64-bit integer's string written as a number.
func (r *numberRewriter) singular(fd protoreflect.FieldDescriptor) error {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return r.message(fd.Message())
	case protoreflect.Int64Kind, protoreflect.Uint64Kind, protoreflect.Sint64Kind,
		protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind:
		if r.peek() == '"' {
			start := r.pos
			if err := r.skipString(); err != nil {
				return err
			}
			if digits := r.in[start+1 : r.pos-1]; isInteger(digits) {
				r.out = append(r.out, digits...)
			} else {
				r.out = append(r.out, r.in[start:r.pos]...)
			}
			return nil
		}
	}
	return r.copyValue()
}

// object copies the object at pos, calling value to copy the value of each member, with
// the member's key, quoted, as it is in the JSON.
func (r *numberRewriter) object(value func(key []byte) error) error {
	return r.container('}', func() error {
		start := r.pos
		if r.peek() != '"' {
			return fmt.Errorf("%w at offset %d: want a key", errBadJSON, r.pos)
		}
		if err := r.skipString(); err != nil {
			return err
		}
		key := r.in[start:r.pos]
		if r.peek() != ':' {
			return fmt.Errorf("%w at offset %d: want ':'", errBadJSON, r.pos)
		}
		r.pos++
		r.out = append(append(r.out, key...), ':')
		return value(key)
	})
}

// container copies the object or array at pos, which ends with end, calling each to
// copy each of its members or elements.
func (r *numberRewriter) container(end byte, each func() error) error {
	r.out = append(r.out, r.in[r.pos])
	r.pos++
	if r.peek() == end {
		r.out = append(r.out, end)
		r.pos++
		return nil
	}
	for {
		if err := each(); err != nil {
			return err
		}
		switch r.peek() {
		case ',':
			r.out = append(r.out, ',')
			r.pos++
		case end:
			r.out = append(r.out, end)
			r.pos++
			return nil
		default:
			return fmt.Errorf("%w at offset %d: want ',' or %q", errBadJSON, r.pos, end)
		}
	}
}

// copyValue copies the value at pos as it is: a string, a number, a literal, or an
// object or array with all it holds.
func (r *numberRewriter) copyValue() error {
	start := r.pos
	if err := r.skipValue(); err != nil {
		return err
	}
	r.out = append(r.out, r.in[start:r.pos]...)
	return nil
}

// skipValue moves pos past the value that starts at pos.
func (r *numberRewriter) skipValue() error {
	switch r.peek() {
	case '"':
		return r.skipString()
	case '{', '[':
		for depth := 0; r.pos < len(r.in); {
			switch r.in[r.pos] {
			case '"':
				if err := r.skipString(); err != nil {
					return err
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			r.pos++
			if depth == 0 {
				return nil
			}
		}
		return fmt.Errorf("%w: unterminated object or array", errBadJSON)
	}
	start := r.pos // a number or a literal: up to what ends it
	for r.pos < len(r.in) && r.in[r.pos] != ',' && r.in[r.pos] != '}' && r.in[r.pos] != ']' {
		r.pos++
	}
	if r.pos == start {
		return fmt.Errorf("%w at offset %d: want a value", errBadJSON, r.pos)
	}
	return nil
}

// skipString moves pos past the string that starts at pos.
func (r *numberRewriter) skipString() error {
	for i := r.pos + 1; i < len(r.in); i++ {
		switch r.in[i] {
		case '\\':
			i++
		case '"':
			r.pos = i + 1
			return nil
		}
	}
	return fmt.Errorf("%w at offset %d: unterminated string", errBadJSON, r.pos)
}

// peek returns the byte at pos, or 0 at the end.
func (r *numberRewriter) peek() byte {
	if r.pos < len(r.in) {
		return r.in[r.pos]
	}
	return 0
}

// isInteger reports whether s is a decimal integer as JSON writes one: an optional minus
// sign and digits without leading zeros.
func isInteger(s []byte) bool {
	if len(s) > 0 && s[0] == '-' {
		s = s[1:]
	}
	if len(s) == 0 || (s[0] == '0' && len(s) > 1) {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

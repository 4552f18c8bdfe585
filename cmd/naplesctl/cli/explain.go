package cli

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/naplesnet/naples/internal/exitstatus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// explainCommand returns the explain command.
func (c *cli) explainCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "explain KIND[.FIELD[.FIELD]...]",
		Short: "Describe a kind's spec, or one of its fields, from the API's documentation",
		Long: `Describe a kind's spec, or one of its fields, from the API's documentation.

KIND is a kind name as get takes it (route, routes, rt). Alone, explain prints the
description of the kind's spec and lists its fields, each with its type and its
description. KIND.FIELD describes one field of the spec, and KIND.FIELD.FIELD a field of
a field that holds a message (a next hop of a route: route.nexthops.gateway), as deep as
the messages go; a field that holds an enum lists its values. meta describes the
metadata every object has (route.meta.labels); spec may stand before the spec's fields
(route.spec.prefix).

Fields are named as manifests write them (tenantTable), or as the .proto does
(tenant_table); the descriptions are the comments of nimbus.proto, which name fields
the .proto's way. Types are written as in Go: []T is a list of T. explain does not talk
to nimbus.`,
		Example: `  naplesctl explain route
  naplesctl explain rt.nexthops
  naplesctl explain networksecuritypolicy.ingress.action`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			e, err := resolveExplain(args[0])
			if err != nil {
				return err
			}
			var out bytes.Buffer
			e.write(&out)
			if _, err := c.stdout.Write(out.Bytes()); err != nil {
				return fmt.Errorf("writing the explanation: %w", err)
			}
			return nil
		},
	}
}

// explanation is what explain prints: a kind's spec, or one field of it, or of a message
// below it.
type explanation struct {
	kind nimbusv1.Kind
	// path is the fields' JSON names from the spec, "" for the spec itself.
	path string
	// field is the field path ends in; nil for the spec.
	field protoreflect.FieldDescriptor
	// md is the message whose fields are listed: the spec's, or the field's when it holds
	// a message (the value's of a map); nil when the field holds none.
	md protoreflect.MessageDescriptor
}

// resolveExplain parses an argument of explain, KIND[.FIELD...], and finds what it names.
// A kind or field that does not exist is a usage error naming it and listing what there
// is.
func resolveExplain(arg string) (*explanation, error) {
	parts := strings.Split(arg, ".")
	kind, err := parseKind(parts[0])
	if err != nil {
		return nil, err
	}
	e := &explanation{kind: kind, md: kind.SpecDescriptor()}
	var path []string
	for i, name := range parts[1:] {
		at := strings.Join(append([]string{kindArg(kind)}, path...), ".")
		if name == "" {
			return nil, exitstatus.Mark(fmt.Errorf("explain %q: empty field name after %s", arg, at))
		}
		if e.md == nil {
			return nil, exitstatus.Mark(fmt.Errorf("explain %q: %s is of type %s, which has no field %q", arg, at, typeName(e.field), name))
		}
		f := findField(e.md, name)
		if f == nil && i == 0 && name == "spec" {
			continue // route.spec.prefix is route.prefix
		}
		if f == nil && i == 0 && name == "meta" {
			f = (&nimbusv1.Object{}).ProtoReflect().Descriptor().Fields().ByName("meta")
		}
		if f == nil {
			return nil, exitstatus.Mark(fmt.Errorf("explain %q: %s has no field %q (fields: %s)",
				arg, at, name, strings.Join(fieldNames(e.md), ", ")))
		}
		path = append(path, f.JSONName())
		e.field, e.md = f, fieldMessage(f)
	}
	e.path = strings.Join(path, ".")
	return e, nil
}

// findField returns md's field called name, by its JSON name or its .proto name, or by
// either in another case when neither matches exactly; nil when md has none.
func findField(md protoreflect.MessageDescriptor, name string) protoreflect.FieldDescriptor {
	fields := md.Fields()
	if f := fields.ByJSONName(name); f != nil {
		return f
	}
	if f := fields.ByName(protoreflect.Name(name)); f != nil {
		return f
	}
	for i := range fields.Len() {
		if f := fields.Get(i); strings.EqualFold(f.JSONName(), name) || strings.EqualFold(string(f.Name()), name) {
			return f
		}
	}
	return nil
}

// fieldMessage returns the message whose fields a field of f's type has: f's message,
// or its map's value's; nil for a scalar, an enum, or a well-known type that manifests
// write as a string (durations and times).
func fieldMessage(f protoreflect.FieldDescriptor) protoreflect.MessageDescriptor {
	if f.IsMap() {
		f = f.MapValue()
	}
	md := f.Message()
	if md == nil || isStringMessage(md) {
		return nil
	}
	return md
}

// isStringMessage reports whether manifests write md as a string: a Duration ("30s") or
// a Timestamp (RFC 3339).
func isStringMessage(md protoreflect.MessageDescriptor) bool {
	switch md.FullName() {
	case (&durationpb.Duration{}).ProtoReflect().Descriptor().FullName(),
		(&timestamppb.Timestamp{}).ProtoReflect().Descriptor().FullName():
		return true
	}
	return false
}

// typeName returns how explain writes f's type: "string", "uint32", "[]NextHop",
// "map[string]string", "Action", "duration".
func typeName(f protoreflect.FieldDescriptor) string {
	if f.IsMap() {
		return "map[" + valueTypeName(f.MapKey()) + "]" + valueTypeName(f.MapValue())
	}
	if f.IsList() {
		return "[]" + valueTypeName(f)
	}
	return valueTypeName(f)
}

// valueTypeName returns the type of one value of f.
func valueTypeName(f protoreflect.FieldDescriptor) string {
	switch f.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		switch f.Message().FullName() {
		case (&durationpb.Duration{}).ProtoReflect().Descriptor().FullName():
			return "duration"
		case (&timestamppb.Timestamp{}).ProtoReflect().Descriptor().FullName():
			return "timestamp"
		}
		return string(f.Message().Name())
	case protoreflect.EnumKind:
		return string(f.Enum().Name())
	}
	return f.Kind().String()
}

// write writes the explanation to out:
//
//	KIND:     Route
//	FIELD:    nexthops <[]NextHop>
//
//	DESCRIPTION:
//	    nexthops lists one or more next hops; more than one makes an ECMP route.
//
//	    NextHop is one next hop of a route.
//
//	FIELDS:
//	    gateway <string>
//	        gateway is the next hop's address, of the same family as the prefix.
//	...
func (e *explanation) write(out *bytes.Buffer) {
	fmt.Fprintf(out, "KIND:     %s\n", e.kind.Name())
	if e.field == nil {
		fmt.Fprintf(out, "NAMES:    %s, %s, %s\n", kindArg(e.kind), e.kind.Plural(), e.kind.ShortName())
		fmt.Fprintf(out, "SPEC:     %s\n", e.md.Name())
	} else {
		fmt.Fprintf(out, "FIELD:    %s <%s>\n", e.path, typeName(e.field))
	}
	out.WriteString("\nDESCRIPTION:\n")
	var texts []string
	if e.field != nil {
		texts = append(texts, nimbusv1.Comment(e.field.FullName()))
	}
	if e.md != nil {
		texts = append(texts, nimbusv1.Comment(e.md.FullName()))
	} else if en := e.field.Enum(); en != nil {
		texts = append(texts, nimbusv1.Comment(en.FullName()))
	}
	described := false
	for _, t := range texts {
		if t == "" {
			continue
		}
		if described {
			out.WriteString("\n")
		}
		writeIndented(out, t, 4)
		described = true
	}
	if !described {
		out.WriteString("    <no description>\n")
	}
	switch {
	case e.md != nil:
		out.WriteString("\nFIELDS:\n")
		fields := e.md.Fields()
		for i := range fields.Len() {
			f := fields.Get(i)
			// A blank line follows a field's description, not a field without one.
			fmt.Fprintf(out, "    %s <%s>\n", f.JSONName(), typeName(f))
			if text := nimbusv1.Comment(f.FullName()); text != "" {
				writeIndented(out, text, 8)
				if i < fields.Len()-1 {
					out.WriteString("\n")
				}
			}
		}
	case e.field.Enum() != nil:
		out.WriteString("\nVALUES:\n")
		values := e.field.Enum().Values()
		for i := range values.Len() {
			v := values.Get(i)
			fmt.Fprintf(out, "    %s\n", v.Name())
			writeIndented(out, nimbusv1.Comment(v.FullName()), 8)
		}
	}
}

// writeIndented writes each line of text indented by n spaces; nothing for "".
func writeIndented(out *bytes.Buffer, text string, n int) {
	if text == "" {
		return
	}
	pad := strings.Repeat(" ", n)
	for line := range strings.SplitSeq(text, "\n") {
		if line == "" {
			out.WriteString("\n")
			continue
		}
		out.WriteString(pad + line + "\n")
	}
}

// Package manifest reads and writes nimbus objects in the manifest shape people edit and
// naplesctl prints:
//
//	kind: Route
//	meta:
//	  name: to-dc2
//	  nodes: [host-a]
//	spec:
//	  table: 100
//	  prefix: 198.51.100.0/24
//	  nexthops:
//	    - gateway: 10.10.0.2
//
// kind is a kind name as [nimbusv1.ParseKind] reads it; meta is a [nimbusv1.ObjectMeta] and
// spec the kind's spec message, both in their protobuf JSON mapping, so field names may be
// written in camelCase (vtepAddress) or as in the .proto file (vtep_address). A field the
// message does not have is an error, never silently dropped.
//
// [Decode] reads YAML (several documents separated by "---") or JSON (one object, an array
// of objects, or a stream of objects). A document holding only "items", a list of objects,
// stands for those objects, so the list output of `naplesctl get -o yaml` can be applied
// again. Errors name the document, counted from 1 over the objects in the input, and the
// field where one is known: `document 1: spec: unknown field "prefx"`. Decode does not
// validate: callers call [nimbusv1.Object.Validate].
//
// [Marshal], [Encode] and [EncodeList] write objects in the same shape, with a "status" key
// added when a status is given; Decode ignores status, so what they write reads back.
package manifest

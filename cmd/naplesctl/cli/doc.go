// Package cli is the naplesctl command line: it applies, gets and deletes nimbus
// objects written in the manifest shape of package manifest.
//
//	naplesctl apply -f route.yaml
//	naplesctl get routes
//	naplesctl get route to-dc2 -o yaml
//	naplesctl delete route to-dc2
//	naplesctl apply -f manifests/ -R
//	naplesctl api-resources -o wide
//	naplesctl explain rt.nexthops
//
// A kind is named in any case, singular, plural or short (route, Routes, rt), as
// [nimbusv1.ParseKind] reads it; api-resources lists the names and each spec's fields,
// and explain prints the comments of nimbus.proto for a kind's spec or a field, which
// `make proto` keeps in package nimbusv1 since the descriptors protoc-gen-go embeds have
// none.
//
// [Run] runs one invocation with its arguments, streams and environment passed in, so the
// whole command tree runs in-process in tests. It talks to the nimbus server named by
// --server, or by the environment variable NAPLES_SERVER, or unix:///run/naples/nimbus.sock.
// Either may list several nimbus replicas, comma-separated; a command talks to one of
// them that is ready, picked at random, and skips those that cannot be reached or do not
// serve yet.
//
// apply validates every object of every file before it sends any: one invalid object
// refuses the whole apply, naming the file, the document, the field and the value. It then
// applies the objects in file order, in batches, with package controller, which apply,
// delete and wait use to talk to nimbus, and prints per object whether it was created,
// configured (with its new generation) or unchanged; an object nimbus refuses is named by
// its document too. delete is idempotent: an
// object that is already gone is reported as not found, which is not an error.
//
// apply --dry-run=server and diff have nimbus check the objects as apply would and answer
// what it would store, storing nothing (nimbus's dry_run): apply prints what would happen
// to each object, diff a unified diff of each object apply would change. version asks
// nimbus for its version too.
//
// get prints as kubectl does: a table, -o wide, name, json, yaml, jsonpath=TEMPLATE and
// custom-columns=HEADER:PATH,... (output.go), and with --watch follows the objects and
// their status through nimbus's status stream (watch.go). Shell completion asks nimbus
// for object and node names (completion.go).
package cli

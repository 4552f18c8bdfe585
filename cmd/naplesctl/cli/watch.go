package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/naplesnet/naples/controller"
	"github.com/naplesnet/naples/internal/manifest"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// deletedMarker ends the row or line of an object that was deleted, in get --watch's
// table, wide, name and custom-columns formats.
const deletedMarker = "DELETED"

// watchObjects prints the objects of kind that the filter selects, as get prints them,
// then every change to them or to their status as nimbus streams it, until ctx ends,
// which is a clean exit. With one set the filter names a single object: it must exist
// when the watch starts, and its JSON document is the object rather than a list.
//
// When there are none, "No resources found." on stderr says so, and the table's header
// waits for the first row. Each change prints one row (table, wide, custom-columns; only when the row differs
// from the object's last one), one line (name) or one document (json, yaml, jsonpath: the
// object's document; YAML documents after the first start with "---"). An object deleted
// prints its last row or line followed by DELETED, or its last document with
// "deleted": true.
func (c *cli) watchObjects(ctx context.Context, kind nimbusv1.Kind, f controller.Filter, one bool, out output) error {
	sess, kit, closeAll, err := c.connectController()
	if err != nil {
		return err
	}
	defer closeAll()
	// The status stream waits for nimbus to be there; a call that does not tells at once
	// when it is not, or when the object does not exist.
	if one {
		if _, err := sess.get(ctx, nimbusv1.NewKey(kind, f.Tenant, f.Namespace, f.Name)); err != nil {
			return err
		}
	} else if _, err := sess.nimbus.List(ctx, &nimbusv1.ListRequest{Kind: kind, Tenant: f.Tenant, Namespace: f.Namespace, Limit: 1}); err != nil {
		return fmt.Errorf("listing %s objects: %w", kind.Name(), sess.rpcError(err))
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w := &watchPrinter{c: c, kind: kind, out: out, last: map[string]*nimbusv1.ObjectWithStatus{},
		rows: &alignedRows{w: c.stdout}, shown: map[string]string{}}
	// initial holds, by key ID, the objects of the current state until it is printed;
	// nil after.
	initial := map[string]*nimbusv1.ObjectWithStatus{}
	fail := func(err error) {
		if err != nil {
			cancel(err)
		}
	}
	r := controller.ReactorFuncs{
		Status: func(item *nimbusv1.ObjectWithStatus) {
			item = withStatus(item)
			id := item.GetObject().Key().ID()
			w.last[id] = item
			if initial != nil {
				initial[id] = item
				return
			}
			fail(w.print([]*nimbusv1.ObjectWithStatus{item}, false))
		},
		Delete: func(key *nimbusv1.ObjectKey) {
			id := key.ID()
			item, ok := w.last[id]
			delete(w.last, id)
			if initial != nil {
				delete(initial, id)
				return
			}
			if ok {
				fail(w.print([]*nimbusv1.ObjectWithStatus{item}, true))
			}
		},
		Synced: func() {
			if initial == nil {
				return
			}
			items := slices.SortedFunc(maps.Values(initial), compareItems)
			initial = nil
			if len(items) == 0 {
				fmt.Fprintln(c.stderr, "No resources found.")
				return
			}
			fail(w.print(items, false))
		},
	}
	err = kit.WatchStatus(ctx, f, r)
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause // writing failed
	}
	if err != nil {
		return fmt.Errorf("watching %s objects: %w", kind.Name(), err)
	}
	return nil
}

// watchPrinter prints what get --watch sees, in its output format.
type watchPrinter struct {
	c    *cli
	kind nimbusv1.Kind
	out  output
	// last holds, by key ID, the last item seen of every object not deleted since, to
	// print an object that is deleted.
	last map[string]*nimbusv1.ObjectWithStatus
	// rows writes the table formats, keeping their columns aligned across changes.
	rows *alignedRows
	// header tells whether the header row has been written.
	header bool
	// shown holds, by key ID, the row last printed of every object, in the table
	// formats: a change that does not show is not printed.
	shown map[string]string
	// docs counts the documents printed, in JSON and YAML.
	docs int
}

// print prints items, the current state or a change; deleted tells that the one item was
// deleted.
func (w *watchPrinter) print(items []*nimbusv1.ObjectWithStatus, deleted bool) error {
	c := w.c
	switch w.out.format {
	case outputName:
		for _, it := range items {
			line := ref(it.GetObject().Key())
			if deleted {
				line += " " + deletedMarker
			}
			fmt.Fprintln(c.stdout, line)
		}
		return nil
	case outputJSON, outputYAML, outputJSONPath:
		for _, it := range items {
			if err := w.document(it, deleted); err != nil {
				return err
			}
		}
		return nil
	}
	var rows [][]string
	if !w.header {
		rows = append(rows, headerOf(w.kind, w.out))
		w.header = true
	}
	for _, it := range items {
		row, err := c.rowOf(it, w.out)
		if err != nil {
			return err
		}
		id := it.GetObject().Key().ID()
		if deleted {
			row = append(row, deletedMarker)
			delete(w.shown, id)
		} else {
			line := fmt.Sprintf("%q", row)
			if w.shown[id] == line {
				continue
			}
			w.shown[id] = line
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		return nil
	}
	return w.rows.write(rows)
}

// document prints the JSON document of item, with "deleted": true when deleted is set,
// in JSON, YAML or through the JSONPath template.
func (w *watchPrinter) document(item *nimbusv1.ObjectWithStatus, deleted bool) error {
	raw, err := manifest.Marshal(item.GetObject(), item.GetStatus())
	if err != nil {
		return err
	}
	if deleted {
		raw = append(bytes.TrimSuffix(raw, []byte("}")), `,"deleted":true}`...)
	}
	if w.out.format == outputJSONPath {
		return w.c.executeJSONPath(w.out.template, raw)
	}
	if w.out.format == outputYAML && w.docs > 0 {
		fmt.Fprint(w.c.stdout, "---\n")
	}
	w.docs++
	return writeDoc(w.c.stdout, w.out.format, raw, false)
}

package delphi

import (
	"strings"
	"unique"

	"github.com/tidwall/btree"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The versions of the desired table are copy-on-write B-trees (github.com/tidwall/btree):
// a tree's Copy shares every node with the tree it copies, and a write to either copies
// each node it changes the first time, and changes in place the nodes it has copied, so a
// commit of 100,000 objects copies each node once, not a path per object. A node holds
// up to 63 items (the library's default degree of 32) and a few dozen bytes of header;
// load fills nodes almost full, and random writes leave them about two thirds full. So an
// item costs its own size and up to as much again: 8 to 16 bytes for a record pointer,
// 16 to 32 for an index entry, where go-memdb's radix trees spent several hundred per
// item and index.
//
// Copy is also a write, of the tree it copies: it makes it a new owner that no longer
// changes the nodes it shares. So the trees readers hold are never copied, nor written
// in any other way: the writer keeps versions of its own (Store.work and Store.base) and
// publishes copies of them. The trees are made without their locks, which readers would
// otherwise take for every read: a published tree is read-only, and the writer's are
// used under Store.writeMu.
var treeOptions = btree.Options{NoLocks: true}

// idTree is the desired table's records by key, in the order of their key IDs.
type idTree = btree.BTreeG[*record]

// indexTree is a declared index's entries, by value and then key.
type indexTree = btree.BTreeG[indexEntry]

func newIDTree() *idTree {
	return btree.NewBTreeGOptions(func(a, b *record) bool { return compareKeys(&a.key, &b.key) < 0 }, treeOptions)
}

func newIndexTree() *indexTree {
	return btree.NewBTreeGOptions(func(a, b indexEntry) bool {
		switch av, bv := a.val(), b.val(); {
		case av != bv:
			return av < bv
		case a.at == probeAt || b.at == probeAt:
			// A probe sorts before every entry of its value.
			return a.at == probeAt && b.at != probeAt
		}
		return compareKeys(&a.rec.key, &b.rec.key) < 0
	}, treeOptions)
}

// load fills the empty tree tr with items, which are sorted and distinct. Loading them in
// order alone (Load) would leave every node half full: a full node splits in two, and
// only the right half takes more items. So load loads every other item, and then sets
// the others, each of which lands in the free half of the node that holds its
// neighbours, without a copy since the tree owns its nodes. Each search starts where the
// last one ended: a set then takes 6 comparisons, where one from the root took 10.
func load[T any](tr *btree.BTreeG[T], items []T) {
	for i := 0; i < len(items); i += 2 {
		tr.Load(items[i])
	}
	var hint btree.PathHint
	for i := 1; i < len(items); i += 2 {
		tr.SetHint(items[i], &hint)
	}
}

// compareKeys orders keys as nimbusv1.Key.Compare does, by their key IDs. Keys of one
// kind, tenant and namespace, as the tables mostly hold, compare by their names here
// without a call, and without reading their tenants and namespaces, which ownKey makes
// records share.
func compareKeys(a, b *nimbusv1.Key) int {
	if a.Kind == b.Kind && a.Tenant == b.Tenant && a.Namespace == b.Namespace {
		return strings.Compare(a.Name, b.Name)
	}
	return a.Compare(*b)
}

// ownKey returns key with strings of its own, which keep none of the memory of the object
// or frame it was taken from: a copy of its name, and a tenant and namespace that every
// key ownKey returns shares with the others of that tenant and namespace (unique.Make),
// so that a record holds only its name apart.
func ownKey(key nimbusv1.Key) nimbusv1.Key {
	key.Tenant = shared(key.Tenant, nimbusv1.DefaultTenant)
	key.Namespace = shared(key.Namespace, nimbusv1.DefaultNamespace)
	key.Name = strings.Clone(key.Name)
	return key
}

// shared returns the one string of s's value that unique.Make keeps, or def when s
// equals it.
func shared(s, def string) string {
	if s == def {
		return def
	}
	return unique.Make(s).Value()
}

// probe returns a record to search the records by key with.
func probe(key nimbusv1.Key) *record { return &record{key: key} }

// copy returns a version of st that shares everything with it; writing either copies
// what it changes. It writes st (see treeOptions): st must not be one that readers hold.
func (st *desiredState) copy() *desiredState {
	c := *st
	c.byID = st.byID.Copy()
	c.indexes = make([]*indexTree, len(st.indexes))
	for i, ix := range st.indexes {
		c.indexes[i] = ix.Copy()
	}
	return &c
}

package firewall

import (
	"encoding/binary"
	"slices"
)

// FNV-1a parameters (hash/fnv's), inlined so that hashing a string allocates nothing.
const (
	fnv32Offset = 2166136261
	fnv32Prime  = 16777619
	fnv64Offset = 14695981039346656037
	fnv64Prime  = 1099511628211
)

// fnv32a returns the 32-bit FNV-1a hash of s.
func fnv32a(s string) uint32 {
	h := uint32(fnv32Offset)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= fnv32Prime
	}
	return h
}

// fnv64a returns the 64-bit FNV-1a hash of s.
func fnv64a(s string) uint64 {
	h := uint64(fnv64Offset)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnv64Prime
	}
	return h
}

// fnv32aBytes continues the 32-bit FNV-1a hash h over b.
func fnv32aBytes(h uint32, b []byte) uint32 {
	for _, c := range b {
		h ^= uint32(c)
		h *= fnv32Prime
	}
	return h
}

// assignIDs gives every distinct string of names an id: its hash, or, when another string
// already holds that id or the id is reserved, the next free one (linear probing, +1,
// wrapping around). The strings are taken in sorted order, so the same set of strings
// always gives the same ids whatever order they come in. names is sorted in place.
func assignIDs[T uint32 | uint64](names []string, hash func(string) T, reserved ...T) map[string]T {
	slices.Sort(names)
	names = slices.Compact(names)
	ids := make(map[string]T, len(names))
	taken := make(map[T]bool, len(names))
	for _, n := range names {
		id := hash(n)
		for taken[id] || slices.Contains(reserved, id) {
			id++
		}
		taken[id] = true
		ids[n] = id
	}
	return ids
}

// ids32 assigns 32-bit ids with FNV-1a, never 0 (none, or the world identity) nor
// AnyIdentity.
func ids32(names []string) map[string]uint32 {
	return assignIDs(names, fnv32a, 0, AnyIdentity)
}

// ids64 assigns 64-bit ids with FNV-1a, never 0 (no rule).
func ids64(names []string) map[string]uint64 {
	return assignIDs(names, fnv64a, 0)
}

// generation returns the generation of a snapshot's sorted entries: the 32-bit FNV-1a hash
// of every entry's key (prefix length, then data) and value (each field in order), all
// big-endian, with the Gen fields taken as zero; never 0. The same entries always give the
// same generation, so an agent that restarts and compiles the same objects keeps every
// connection it tracked valid.
func generation(entries []Entry) uint32 {
	h := uint32(fnv32Offset)
	var b [4 + 24 + 6*4 + 8]byte
	for _, e := range entries {
		binary.BigEndian.PutUint32(b[0:4], e.Key.PrefixLen)
		copy(b[4:28], e.Key.Data[:])
		v := e.Value
		binary.BigEndian.PutUint32(b[28:32], v.ID)
		binary.BigEndian.PutUint32(b[32:36], v.Subject)
		binary.BigEndian.PutUint32(b[36:40], v.Flags)
		binary.BigEndian.PutUint32(b[40:44], 0) // Gen
		binary.BigEndian.PutUint32(b[44:48], v.Scope)
		binary.BigEndian.PutUint32(b[48:52], v.Verdict)
		binary.BigEndian.PutUint64(b[52:60], v.Rule)
		h = fnv32aBytes(h, b[:])
	}
	if h == 0 {
		h = 1
	}
	return h
}

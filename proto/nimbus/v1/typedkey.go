package nimbusv1

import (
	"fmt"
	"log/slog"
	"strings"
)

// Key identifies one object: its kind, tenant, namespace and name, with tenant and
// namespace defaulted. Unlike the wire form ObjectKey it is comparable, so it keys maps,
// work queues and indexes as it is. Its String form is the canonical key ID,
// "Kind/tenant/namespace/name"; the proto ObjectKey and the string form belong at the
// edges (gRPC, the CLI, keys on disk). The zero Key names no object.
type Key struct {
	Kind      Kind
	Tenant    string
	Namespace string
	Name      string
}

// MakeKey returns the key of the object of the kind and name, with empty tenant and
// namespace set to their defaults.
func MakeKey(kind Kind, tenant, namespace, name string) Key {
	if tenant == "" {
		tenant = DefaultTenant
	}
	if namespace == "" {
		namespace = DefaultNamespace
	}
	return Key{Kind: kind, Tenant: tenant, Namespace: namespace, Name: name}
}

// Key returns the comparable form of the key, with tenant and namespace defaulted, whose
// String is what ID returns, also for a nil key.
func (k *ObjectKey) Key() Key {
	return MakeKey(k.GetKind(), k.GetTenant(), k.GetNamespace(), k.GetName())
}

// TypedKey returns the object's key in its comparable form, with tenant and namespace
// defaulted.
func (o *Object) TypedKey() Key {
	m := o.GetMeta()
	return MakeKey(o.Kind(), m.GetTenant(), m.GetNamespace(), m.GetName())
}

// Proto returns the key in its wire form.
func (k Key) Proto() *ObjectKey {
	return &ObjectKey{Kind: k.Kind, Tenant: k.Tenant, Namespace: k.Namespace, Name: k.Name}
}

// IsZero reports whether the key is the zero Key, which names no object.
func (k Key) IsZero() bool { return k == Key{} }

// String returns the key's canonical form, "Kind/tenant/namespace/name", exactly what
// ObjectKey.ID returns: kernel identifiers derive from it.
func (k Key) String() string {
	kind := k.Kind.Name()
	var b strings.Builder
	b.Grow(len(kind) + len(k.Tenant) + len(k.Namespace) + len(k.Name) + 3)
	b.WriteString(kind)
	b.WriteByte('/')
	b.WriteString(k.Tenant)
	b.WriteByte('/')
	b.WriteString(k.Namespace)
	b.WriteByte('/')
	b.WriteString(k.Name)
	return b.String()
}

// LogValue logs the key in its String form.
func (k Key) LogValue() slog.Value { return slog.StringValue(k.String()) }

// Compare returns -1, 0 or +1 as k's String form sorts before, equal to or after o's,
// without building either: tables ordered by key keep the order of their key IDs. The
// zero Key, which names no object, sorts before every other, so that it probes a table
// ordered by something else first and then by key.
func (k Key) Compare(o Key) int {
	if k.Kind == o.Kind && k.Tenant == o.Tenant && k.Namespace == o.Namespace {
		// Keys of one kind and namespace, as a table mostly holds, have String forms that
		// agree up to their names, the last part: the names alone decide. A zero key's
		// name is empty, so it sorts first here too.
		return strings.Compare(k.Name, o.Name)
	}
	if k.IsZero() || o.IsZero() {
		switch {
		case k == o:
			return 0
		case k.IsZero():
			return -1
		}
		return +1
	}
	c := 0
	if k.Kind != o.Kind {
		c = comparePart(k.Kind.Name(), o.Kind.Name(), false)
	}
	if c == 0 {
		c = comparePart(k.Tenant, o.Tenant, false)
	}
	if c == 0 {
		c = comparePart(k.Namespace, o.Namespace, false)
	}
	if c == 0 {
		c = comparePart(k.Name, o.Name, true)
	}
	if c == undecided {
		return strings.Compare(k.String(), o.String())
	}
	return c
}

// undecided is what comparePart returns when only the whole strings can decide.
const undecided = 2

// comparePart compares the parts a and b of two String forms that agree up to them: 0
// when the parts are equal, -1 or +1 when they decide the order, and undecided when one
// part holds a '/' where the other ends. Where one part is a prefix of the other, the
// shorter one's next byte is its separator '/', or its end for the last part.
func comparePart(a, b string, last bool) int {
	if a == b {
		return 0
	}
	n := min(len(a), len(b))
	if c := strings.Compare(a[:n], b[:n]); c != 0 {
		return c
	}
	sign := -1 // a is the shorter one
	next := byte(0)
	if len(a) < len(b) {
		next = b[n]
	} else {
		sign, next = +1, a[n]
	}
	switch {
	case last || next > '/':
		return sign
	case next < '/':
		return -sign
	}
	return undecided
}

// Clone returns the key with strings of its own, so that it keeps none of the memory of
// the object or frame it was taken from; the default tenant and namespace cost nothing.
func (k Key) Clone() Key {
	k.Tenant = cloneDefaulted(k.Tenant, DefaultTenant)
	k.Namespace = cloneDefaulted(k.Namespace, DefaultNamespace)
	k.Name = strings.Clone(k.Name)
	return k
}

func cloneDefaulted(s, def string) string {
	if s == def {
		return def
	}
	return strings.Clone(s)
}

// ParseKey parses the form String returns, defaulting an empty tenant or namespace. It is
// for the edges: keys as users type them and as they are stored on disk.
func ParseKey(id string) (Key, error) {
	kindName, rest, ok1 := strings.Cut(id, "/")
	tenant, rest, ok2 := strings.Cut(rest, "/")
	namespace, name, ok3 := strings.Cut(rest, "/")
	if !ok1 || !ok2 || !ok3 || strings.Contains(name, "/") {
		return Key{}, fmt.Errorf("key %q: want Kind/tenant/namespace/name", id)
	}
	kind, err := ParseKind(kindName)
	if err != nil {
		return Key{}, err
	}
	return MakeKey(kind, tenant, namespace, name), nil
}

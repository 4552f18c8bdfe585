package nimbusv1

import "iter"

// KeyMap is a map by Key for tables that hold an entry for every object: it keeps its
// entries in a map per kind, tenant and namespace, keyed by name, so that an entry's
// place holds a name (16 bytes) and not a whole Key (56). A map keeps the name it is
// given last, so a caller can have the entries share their names' strings with a record
// that holds them anyway. The zero KeyMap is empty; a KeyMap is not safe for use by
// several goroutines at once.
type KeyMap[V any] struct {
	scopes map[keyScope]map[string]V
	n      int
}

// keyScope is what a key holds besides its name.
type keyScope struct {
	kind              Kind
	tenant, namespace string
}

// scopeOf returns the scope of a key.
func scopeOf(k Key) keyScope {
	return keyScope{kind: k.Kind, tenant: k.Tenant, namespace: k.Namespace}
}

// Get returns the value of k and whether there is one.
func (m *KeyMap[V]) Get(k Key) (V, bool) {
	v, ok := m.scopes[scopeOf(k)][k.Name]
	return v, ok
}

// Has reports whether k has a value.
func (m *KeyMap[V]) Has(k Key) bool {
	_, ok := m.scopes[scopeOf(k)][k.Name]
	return ok
}

// Set sets the value of k.
func (m *KeyMap[V]) Set(k Key, v V) {
	sc := scopeOf(k)
	names := m.scopes[sc]
	if names == nil {
		if m.scopes == nil {
			m.scopes = map[keyScope]map[string]V{}
		}
		names = map[string]V{}
		m.scopes[sc] = names
	}
	if _, ok := names[k.Name]; !ok {
		m.n++
	}
	names[k.Name] = v
}

// Delete removes the value of k, if any, and the map of its scope once empty.
func (m *KeyMap[V]) Delete(k Key) {
	sc := scopeOf(k)
	names := m.scopes[sc]
	if _, ok := names[k.Name]; !ok {
		return
	}
	delete(names, k.Name)
	m.n--
	if len(names) == 0 {
		delete(m.scopes, sc)
	}
}

// Len returns the number of keys with a value.
func (m *KeyMap[V]) Len() int { return m.n }

// All returns every key and its value, in no order. The map must not change while it
// is walked.
func (m *KeyMap[V]) All() iter.Seq2[Key, V] {
	return func(yield func(Key, V) bool) {
		for sc, names := range m.scopes {
			for name, v := range names {
				if !yield(Key{Kind: sc.kind, Tenant: sc.tenant, Namespace: sc.namespace, Name: name}, v) {
					return
				}
			}
		}
	}
}

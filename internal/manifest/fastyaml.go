package manifest

import (
	"encoding/json"
	"iter"
	"math"
	"slices"
	"strings"
	"sync"
)

// simpleYAMLToJSON converts a YAML document to JSON, as yaml.YAMLToJSONStrict does, when
// the document keeps to the subset simpleYAMLFields takes, and reports whether it did.
func simpleYAMLToJSON(doc []byte) ([]byte, bool) {
	fields, ok := simpleYAMLFields(doc)
	if !ok {
		return nil, false
	}
	out, err := json.Marshal(fields)
	return out, err == nil
}

// simpleYAMLFields converts a YAML document whose top level is a mapping to the JSON of
// each of its fields, as yaml.YAMLToJSONStrict and then json.Unmarshal into a map of
// json.RawMessage do, when the document keeps to the subset simpleYAMLMapping takes, and
// reports whether it did.
func simpleYAMLFields(doc []byte) (map[string]json.RawMessage, bool) {
	m, ok := simpleYAMLMapping(doc)
	if !ok {
		return nil, false
	}
	return jsonFields(m)
}

// simpleYAMLMapping parses a YAML document whose top level is a mapping, when the
// document keeps to the plain subset most manifests are written in: block mappings and
// sequences indented with spaces, flow mappings and sequences within one line (a document
// may be one such mapping), plain scalars that are unmistakably strings or decimal
// integers, and quoted strings without escapes. Its result is the document's mapping as a
// yamlValue, whose strings, integers, sequences and mappings mean what
// yaml.YAMLToJSONStrict would convert them to. It reports false, and YAMLToJSONStrict is
// to be used, for anything else: comments after a value, anchors, tags, flow collections
// over several lines, multi-line scalars, booleans, nulls, floats, duplicate keys. It is
// the same conversion at a fraction of the cost.
//
// The document is read line by line as it is parsed, with no list of its lines made
// first, and its values are appended to one slice of nodes (see yamlValue), collected in
// a parser's room kept from document to document and copied once into a slice of their
// size: a document costs two allocations, its text (all its strings are parts of it) and
// its nodes, however many values it holds. The subset takes documents of less than 2 GB,
// whose offsets fit in the int32s of a span.
func simpleYAMLMapping(doc []byte) (yamlValue, bool) {
	// The document is copied first, and the copy checked: copying reads a document from
	// memory faster than checking its bytes one by one does, and the check then finds it
	// in the cache.
	text := string(doc)
	if len(text) > math.MaxInt32 || !subsetText(text) {
		return yamlValue{}, false
	}
	p := subsetParsers.Get().(*yamlSubset)
	defer func() {
		if cap(p.nodes) <= maxPooledNodes {
			*p = yamlSubset{treeBuilder: treeBuilder{nodes: p.nodes[:0]}}
			subsetParsers.Put(p)
		}
	}()
	p.doc = text
	p.next()
	if !p.more || p.line.indent != 0 {
		return yamlValue{}, false
	}
	if l := p.line; l.text[0] == '{' {
		// A document that is one flow mapping.
		p.next()
		if p.more || !p.inlineValue(l.text, l.at) || p.nodes[0].kind != yamlMapping {
			return yamlValue{}, false
		}
	} else if !p.mapping(0) || p.more {
		return yamlValue{}, false
	}
	return yamlValue{doc: p.doc, nodes: slices.Clone(p.nodes)}, true
}

// subsetText reports whether doc is text the subset may hold: printable ASCII lines (no
// tabs, CRs, control or non-ASCII bytes), with a '#' only where a comment line starts.
// A comment after a value is refused, as the subset does not tell it from a '#' that
// belongs to the value. Most documents have no '#' at all, which one search tells.
func subsetText(doc string) bool {
	for i := 0; i < len(doc); i++ {
		if !subsetBytes[doc[i]] {
			return false
		}
	}
	if strings.IndexByte(doc, '#') < 0 {
		return true
	}
	for line := range strings.Lines(doc) {
		trimmed := strings.TrimLeft(line, " ")
		if trimmed != "" && trimmed[0] != '#' && strings.IndexByte(trimmed, '#') >= 0 {
			return false
		}
	}
	return true
}

// subsetBytes tells the bytes the subset's text may hold: printable ASCII and newlines.
// Looking a byte up costs less than comparing it with the ends of that range and with a
// newline, which shows in a document of some hundred bytes.
var subsetBytes = func() (ok [256]bool) {
	for c := ' '; c <= '~'; c++ {
		ok[c] = true
	}
	ok['\n'] = true
	return ok
}()

// jsonFields returns the JSON of each value of a mapping of the subset, and false when a
// value is not one of the subset's.
func jsonFields(m yamlValue) (map[string]json.RawMessage, bool) {
	fields := make(map[string]json.RawMessage, m.count())
	for v := range m.values() {
		raw, ok := appendJSON(nil, v)
		if !ok {
			return nil, false
		}
		fields[v.key()] = raw
	}
	return fields, true
}

// appendJSON appends v, a value of the subset, to b as json.Marshal writes it: keys in
// order, and <, > and & escaped. It does without json.Marshal's reflection, as the
// subset's strings are printable ASCII without quotes or backslashes. It reports false for
// a value of no kind of the subset's.
func appendJSON(b []byte, v yamlValue) ([]byte, bool) {
	ok := true
	switch v.kind() {
	case yamlString:
		return appendJSONString(b, v.text()), true
	case yamlInt:
		return append(b, v.text()...), true
	case yamlSeq:
		b = append(b, '[')
		i := 0
		for e := range v.values() {
			if i > 0 {
				b = append(b, ',')
			}
			i++
			if b, ok = appendJSON(b, e); !ok {
				return nil, false
			}
		}
		return append(b, ']'), true
	case yamlMapping:
		b = append(b, '{')
		sorted := slices.SortedFunc(v.values(), func(x, y yamlValue) int { return strings.Compare(x.key(), y.key()) })
		for i, e := range sorted {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, e.key())
			b = append(b, ':')
			if b, ok = appendJSON(b, e); !ok {
				return nil, false
			}
		}
		return append(b, '}'), true
	}
	return nil, false
}

// appendJSONString appends s, a string of the subset, to b as json.Marshal writes it.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '<', '>', '&':
			b = append(b, `\u00`...)
			b = append(b, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// yamlValue is a value of the subset (a string, a decimal integer, a sequence or a
// mapping) laid out flat: its first node is the value itself and, for a collection, the
// nodes of its values follow in the order written, each value's node followed by those
// of its own values. A whole document is so one slice, allocated once, and a value within
// it a part of that slice, exactly its nodes, which costs nothing to hand on. Keys and
// texts are spans of the document's text, so that nodes hold no pointers: the garbage
// collector neither scans them nor needs write barriers to copy them. Where a tree of Go
// values would box every string and every collection in an interface, and hold each
// collection in a slice of its own, a route's document would cost some thirty
// allocations more, and twice the memory.
type yamlValue struct {
	// doc is the text of the document the value is in.
	doc   string
	nodes []yamlNode
}

// yamlNode is one value in a yamlValue, without the values of a collection, which are
// nodes of their own.
type yamlNode struct {
	// key is the value's key, when it is a value of a mapping.
	key span
	// text is a string's characters, or the digits of an integer.
	text span
	// size is the number of nodes of the value: 1 for a scalar; for a collection, 1 and
	// those of all its values.
	size int32
	kind yamlKind
}

// span is a part of a document's text: the offsets of its first byte and of the byte
// after its last.
type span struct {
	start, end int32
}

// spanAt returns the span of the n bytes at offset at.
func spanAt(at, n int) span {
	return span{int32(at), int32(at + n)}
}

// yamlKind is which kind of value a yamlNode is.
type yamlKind uint8

const (
	// noValue is the kind of the zero yamlValue, which stands for a value not given.
	noValue yamlKind = iota
	yamlString
	yamlInt
	yamlSeq
	yamlMapping
)

// kind returns the kind of the value, noValue for the zero yamlValue.
func (v yamlValue) kind() yamlKind {
	if len(v.nodes) == 0 {
		return noValue
	}
	return v.nodes[0].kind
}

// key returns the value's key in its mapping.
func (v yamlValue) key() string { return v.str(v.nodes[0].key) }

// text returns the characters of a string or the digits of an integer.
func (v yamlValue) text() string { return v.str(v.nodes[0].text) }

// str returns the text of a span of the value's document.
func (v yamlValue) str(s span) string { return v.doc[s.start:s.end] }

// values returns the values of a collection in the order written, with their keys for a
// mapping's.
func (v yamlValue) values() iter.Seq[yamlValue] {
	return func(yield func(yamlValue) bool) {
		for rest := v.nodes[1:]; len(rest) > 0; {
			n := rest[0].size
			if !yield(yamlValue{v.doc, rest[:n]}) {
				return
			}
			rest = rest[n:]
		}
	}
}

// count returns the number of values of a collection.
func (v yamlValue) count() int {
	n := 0
	for i := 1; i < len(v.nodes); i += int(v.nodes[i].size) {
		n++
	}
	return n
}

// treeBuilder appends the nodes of a document's values as they are parsed, each
// collection's node before those of its values.
type treeBuilder struct {
	// doc is the document's text.
	doc   string
	nodes []yamlNode
}

// open appends the node of a collection of kind, whose values are to follow, and returns
// its index, for close.
func (t *treeBuilder) open(kind yamlKind) int {
	t.nodes = append(t.nodes, yamlNode{kind: kind})
	return len(t.nodes) - 1
}

// close ends the collection whose node is at index i after its last value. A document
// has fewer nodes than bytes, so that the count fits in an int32.
func (t *treeBuilder) close(i int) {
	t.nodes[i].size = int32(len(t.nodes) - i)
}

// scalar appends the node of the scalar text, which is at offset at in the document, and
// reports false when text is not a scalar of the subset.
func (t *treeBuilder) scalar(text string, at int) bool {
	kind, s, ok := scalar(text)
	if !ok {
		return false
	}
	if q := text[0]; q == '"' || q == '\'' {
		at++ // a quoted string's characters start after the quote
	}
	t.nodes = append(t.nodes, yamlNode{text: spanAt(at, len(s)), size: 1, kind: kind})
	return true
}

// setKey gives the value whose node is at index i its key in the mapping being parsed,
// the span k of the document.
func (t *treeBuilder) setKey(i int, k span) { t.nodes[i].key = k }

// keyOf returns the key of the value whose node is at index i.
func (t *treeBuilder) keyOf(i int) string {
	k := t.nodes[i].key
	return t.doc[k.start:k.end]
}

// mappingKeys refuses a duplicate key in a mapping being parsed: it looks through the
// keys of the mapping's values so far while they are few, and keeps an index of them once
// they are more than indexKeysAbove, so that a long mapping costs no more than a map
// would. The mapping's values must all be complete when it is asked, as they are between
// two keys.
type mappingKeys struct {
	// m is the index of the mapping's node; n the number of its keys so far.
	m, n  int
	index map[string]struct{}
}

// indexKeysAbove is how many keys a mapping holds before mappingKeys indexes them.
const indexKeysAbove = 16

// has reports whether the mapping has key already.
func (k *mappingKeys) has(t *treeBuilder, key string) bool {
	if k.index != nil {
		_, ok := k.index[key]
		return ok
	}
	for i := k.m + 1; i < len(t.nodes); i += int(t.nodes[i].size) {
		if t.keyOf(i) == key {
			return true
		}
	}
	return false
}

// added counts the key of the value parsed last, which the mapping did not have.
func (k *mappingKeys) added(t *treeBuilder, key string) {
	k.n++
	switch {
	case k.index != nil:
		k.index[key] = struct{}{}
	case k.n > indexKeysAbove:
		k.index = make(map[string]struct{}, 2*indexKeysAbove)
		for i := k.m + 1; i < len(t.nodes); i += int(t.nodes[i].size) {
			k.index[t.keyOf(i)] = struct{}{}
		}
	}
}

// yamlSubset parses the lines of one document in the subset simpleYAMLMapping takes,
// into the nodes of its treeBuilder.
type yamlSubset struct {
	treeBuilder
	// off is the offset in the document of the line after the current one.
	off int
	// line is the current line, the next to parse; more is false once past the last one.
	line subsetLine
	more bool
}

// subsetParsers holds parsers between documents, for the room their nodes have grown.
var subsetParsers = sync.Pool{New: func() any { return new(yamlSubset) }}

// maxPooledNodes bounds the room for nodes subsetParsers keeps: the parser of a document
// far larger than manifests' objects is left to the garbage collector.
const maxPooledNodes = 1 << 12

// subsetLine is one line that is not blank or a comment: its indentation and the rest,
// without trailing spaces, which is at offset at in the document.
type subsetLine struct {
	indent, at int
	text       string
}

// next makes the next line that is not blank or a comment the current line, or sets more
// to false at the end of the document.
func (p *yamlSubset) next() {
	for p.off < len(p.doc) {
		start := p.off
		text := p.doc[start:]
		if n := strings.IndexByte(text, '\n'); n >= 0 {
			text = text[:n]
			p.off++ // the newline
		}
		p.off += len(text)
		trimmed := strings.TrimLeft(text, " ")
		if trimmed != "" && trimmed[0] != '#' {
			indent := len(text) - len(trimmed)
			p.line = subsetLine{indent: indent, at: start + indent, text: strings.TrimRight(trimmed, " ")}
			p.more = true
			return
		}
	}
	p.more = false
}

// mapping parses the block mapping whose keys start at column indent, from the current line.
func (p *yamlSubset) mapping(indent int) bool {
	keys := mappingKeys{m: p.open(yamlMapping)}
	for p.more {
		l := p.line
		if l.indent < indent {
			break
		}
		if l.indent > indent || strings.HasPrefix(l.text, "-") {
			return false
		}
		key, rest, found := strings.Cut(l.text, ":")
		if !found || !plainKey(key) || (rest != "" && rest[0] != ' ') {
			return false
		}
		if keys.has(&p.treeBuilder, key) {
			return false
		}
		p.next()
		rest = strings.TrimLeft(rest, " ")
		v := len(p.nodes)
		var ok bool
		if rest == "" {
			ok = p.nested(indent)
		} else {
			// rest is the end of the line's text.
			ok = p.inlineValue(rest, l.at+len(l.text)-len(rest))
		}
		if !ok {
			return false
		}
		p.setKey(v, spanAt(l.at, len(key)))
		keys.added(&p.treeBuilder, key)
	}
	p.close(keys.m)
	return true
}

// nested parses the value of a key at column indent whose line ends after the colon: a
// block indented further, or a sequence at the key's own column.
func (p *yamlSubset) nested(indent int) bool {
	if !p.more {
		return false // null
	}
	l := p.line
	switch {
	case l.indent == indent && isItem(l.text):
		return p.sequence(indent)
	case l.indent <= indent:
		return false // null
	case isItem(l.text):
		return p.sequence(l.indent)
	}
	return p.mapping(l.indent)
}

// isItem reports whether a line starts a sequence item.
func isItem(text string) bool {
	return text == "-" || strings.HasPrefix(text, "- ")
}

// sequence parses the block sequence whose dashes are at column indent.
func (p *yamlSubset) sequence(indent int) bool {
	s := p.open(yamlSeq)
	for p.more {
		l := p.line
		if l.indent < indent || (l.indent == indent && !isItem(l.text)) {
			break
		}
		if l.indent > indent || !strings.HasPrefix(l.text, "- ") {
			return false
		}
		item := l.text[2:]
		if item == "" || item[0] == ' ' || item[0] == '-' {
			return false
		}
		if key, _, found := strings.Cut(item, ":"); found && plainKey(key) {
			// A mapping that starts on the dash's line, its keys at the column after "- ".
			p.line = subsetLine{indent: indent + 2, at: l.at + 2, text: item}
			if !p.mapping(indent + 2) {
				return false
			}
			continue
		}
		if !p.inlineValue(item, l.at+2) {
			return false
		}
		p.next()
	}
	p.close(s)
	return true
}

// inlineValue parses a value written on the line of its key or dash, at offset at in the
// document: a scalar, or a flow mapping or sequence on that one line (`{name: r1, nodes:
// [host-a]}`, as generators write them) of scalars and of flow collections.
func (p *yamlSubset) inlineValue(text string, at int) bool {
	if text[0] != '[' && text[0] != '{' {
		return p.scalar(text, at)
	}
	f := flow{t: &p.treeBuilder, text: text, at: at}
	ok := f.node()
	f.space()
	return ok && f.i == len(text)
}

// maxFlowDepth bounds how deep flow collections nest in the subset.
const maxFlowDepth = 16

// flow parses flow collections within one line, the subset of them whose keys are plain
// keys followed by ": ", whose plain scalars hold no colon, and whose collections end
// without a trailing comma; anything else is left to YAMLToJSONStrict.
type flow struct {
	t *treeBuilder
	// text is the text to parse, at offset at in the document.
	text string
	at   int
	// i is the position of the next byte to read; depth the number of collections open.
	i, depth int
}

// space skips spaces.
func (f *flow) space() {
	for f.i < len(f.text) && f.text[f.i] == ' ' {
		f.i++
	}
}

// node parses a flow mapping, a flow sequence or a scalar, from the current position.
func (f *flow) node() bool {
	f.space()
	if f.i == len(f.text) {
		return false
	}
	switch f.text[f.i] {
	case '{':
		return f.collection('}')
	case '[':
		return f.collection(']')
	}
	return f.scalar()
}

// collection parses the flow mapping or sequence that starts at the current position and
// ends with end.
func (f *flow) collection(end byte) bool {
	if f.depth++; f.depth > maxFlowDepth {
		return false
	}
	defer func() { f.depth-- }()
	f.i++ // the opening bracket
	kind := yamlSeq
	if end == '}' {
		kind = yamlMapping
	}
	keys := mappingKeys{m: f.t.open(kind)}
	f.space()
	if f.i < len(f.text) && f.text[f.i] == end {
		f.i++
		f.t.close(keys.m)
		return true
	}
	for {
		f.space()
		var key string
		keyAt := f.i
		if end == '}' {
			for f.i < len(f.text) && (isLetter(f.text[f.i]) || isDigit(f.text[f.i]) || f.text[f.i] == '_') {
				f.i++
			}
			key = f.text[keyAt:f.i]
			if !plainKey(key) || !strings.HasPrefix(f.text[f.i:], ": ") {
				return false
			}
			if keys.has(f.t, key) {
				return false
			}
			f.i += 2
		}
		v := len(f.t.nodes)
		if !f.node() {
			return false
		}
		if end == '}' {
			f.t.setKey(v, spanAt(f.at+keyAt, len(key)))
			keys.added(f.t, key)
		}
		f.space()
		if f.i == len(f.text) {
			return false
		}
		switch f.text[f.i] {
		case ',':
			f.i++
		case end:
			f.i++
			f.t.close(keys.m)
			return true
		default:
			return false
		}
	}
}

// scalar parses a scalar within a flow collection: quoted, up to its closing quote, or
// plain, up to the next comma or bracket.
func (f *flow) scalar() bool {
	start := f.i
	if q := f.text[f.i]; q == '"' || q == '\'' {
		n := strings.IndexByte(f.text[f.i+1:], q)
		if n < 0 {
			return false
		}
		f.i += n + 2
		return f.t.scalar(f.text[start:f.i], f.at+start)
	}
	for f.i < len(f.text) && !flowIndicator(f.text[f.i]) {
		if f.text[f.i] == ':' {
			// A key, or a colon YAML reads differently in flow context.
			return false
		}
		f.i++
	}
	return f.t.scalar(strings.TrimRight(f.text[start:f.i], " "), f.at+start)
}

// flowIndicator reports whether c ends a plain scalar in a flow collection.
func flowIndicator(c byte) bool {
	switch c {
	case ',', '[', ']', '{', '}':
		return true
	}
	return false
}

// scalar reads a scalar: a quoted string without escapes, a decimal integer, or a plain
// string that YAML cannot read as anything else. It returns the kind of the value and
// its text, and false for any other scalar.
func scalar(text string) (yamlKind, string, bool) {
	if text == "" {
		return 0, "", false
	}
	switch q := text[0]; q {
	case '"', '\'':
		if len(text) < 2 || text[len(text)-1] != q {
			return 0, "", false
		}
		s := text[1 : len(text)-1]
		if strings.ContainsAny(s, `"'\`) {
			return 0, "", false
		}
		return yamlString, s, true
	}
	// A plain scalar of the subset holds letters, digits, spaces and ._/:- only, and no
	// colon at its end or before a space, which would make it a key. What YAML reads one
	// that starts with a digit as depends on the rest, which the same one pass over the
	// text tells: whether it is all digits, how many dots it has, whether it has a slash
	// or a separator (- _ or a space).
	digits, slash, separator, dots := true, false, false, 0
	for i := 0; i < len(text); i++ {
		switch c := text[i]; {
		case isDigit(c):
		case isLetter(c):
			digits = false
		case c == '.':
			digits = false
			dots++
		case c == '/':
			digits, slash = false, true
		case c == '-' || c == '_' || c == ' ':
			digits, separator = false, true
		case c == ':':
			if i == len(text)-1 || text[i+1] == ' ' {
				return 0, "", false
			}
			digits = false
		default:
			return 0, "", false
		}
	}
	c := text[0]
	switch {
	case isLetter(c):
		if yamlWord(text) {
			return 0, "", false
		}
		return yamlString, text, true
	case isDigit(c):
		if digits {
			if len(text) > 18 || (len(text) > 1 && c == '0') {
				return 0, "", false
			}
			return yamlInt, text, true
		}
		// Not an integer, float or timestamp: a prefix or an address.
		if separator || !(slash || dots >= 2) {
			return 0, "", false
		}
		return yamlString, text, true
	}
	return 0, "", false
}

// maxKeyLen bounds the keys of the subset, well below the 1024 characters YAML allows an
// implicit key.
const maxKeyLen = 128

// plainKey reports whether a mapping key is a word YAML reads as that string.
func plainKey(key string) bool {
	if key == "" || len(key) > maxKeyLen || !isLetter(key[0]) || yamlWord(key) {
		return false
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; !isLetter(c) && !isDigit(c) && c != '_' {
			return false
		}
	}
	return true
}

// yamlWord reports whether a letter-led plain scalar is one YAML 1.1 reads as a boolean or
// null, in any case. The subset's text is ASCII, which is lowered here into an array on
// the stack rather than with strings.ToLower, which allocates for every word with a
// capital, such as every "kind: Route".
func yamlWord(s string) bool {
	const longest = len("false")
	if len(s) > longest || s == "" {
		return false
	}
	switch s[0] | ('a' - 'A') { // the lower case of a letter
	case 'y', 'n', 't', 'f', 'o':
	default:
		return false // as most words, no boolean or null
	}
	var lower [longest]byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		lower[i] = c
	}
	switch string(lower[:len(s)]) {
	case "y", "yes", "n", "no", "true", "false", "on", "off", "null":
		return true
	}
	return false
}

// isLetter reports whether c is an ASCII letter.
func isLetter(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

// isDigit reports whether c is a decimal digit.
func isDigit(c byte) bool { return c >= '0' && c <= '9' }

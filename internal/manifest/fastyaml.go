package manifest

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
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
// integers, and quoted strings without escapes. Its values are strings, json.Numbers,
// []any and yamlMap of them, which mean what yaml.YAMLToJSONStrict would convert them
// to. It reports false, and YAMLToJSONStrict is to be used, for anything else:
// comments after a value, anchors, tags, flow collections over several lines,
// multi-line scalars, booleans, nulls, floats, duplicate keys. It is the same conversion
// at a fraction of the cost.
func simpleYAMLMapping(doc []byte) (yamlMap, bool) {
	p := &yamlSubset{lines: make([]subsetLine, 0, bytes.Count(doc, []byte{'\n'})+1)}
	for line := range strings.Lines(string(doc)) {
		text := strings.TrimSuffix(line, "\n")
		for i := 0; i < len(text); i++ {
			if c := text[i]; c < ' ' || c > '~' {
				return nil, false // tabs, CR, control and non-ASCII bytes
			}
		}
		trimmed := strings.TrimLeft(text, " ")
		if trimmed == "" || trimmed[0] == '#' {
			continue
		}
		if strings.IndexByte(trimmed, '#') >= 0 {
			return nil, false
		}
		p.lines = append(p.lines, subsetLine{indent: len(text) - len(trimmed), text: strings.TrimRight(trimmed, " ")})
	}
	if len(p.lines) == 0 || p.lines[0].indent != 0 {
		return nil, false
	}
	if p.lines[0].text[0] == '{' {
		// A document that is one flow mapping.
		v, ok := inlineValue(p.lines[0].text)
		m, isMap := v.(yamlMap)
		if !ok || !isMap || len(p.lines) != 1 {
			return nil, false
		}
		return m, true
	}
	m, ok := p.mapping(0)
	if !ok || p.pos != len(p.lines) {
		return nil, false
	}
	return m, true
}

// jsonFields returns the JSON of each value of a mapping of the subset, and false when a
// value is not one of the subset's.
func jsonFields(m yamlMap) (map[string]json.RawMessage, bool) {
	fields := make(map[string]json.RawMessage, len(m))
	for _, p := range m {
		raw, ok := appendJSON(nil, p.val)
		if !ok {
			return nil, false
		}
		fields[p.key] = raw
	}
	return fields, true
}

// appendJSON appends v, a value of the subset (a string, a json.Number, a []any or a
// yamlMap of them), to b as json.Marshal writes it: keys in order, and <, > and &
// escaped. It does without json.Marshal's reflection, as the subset's strings are
// printable ASCII without quotes or backslashes. It reports false for any other value.
func appendJSON(b []byte, v any) ([]byte, bool) {
	ok := true
	switch v := v.(type) {
	case string:
		b = append(b, '"')
		for i := 0; i < len(v); i++ {
			switch c := v[i]; c {
			case '<', '>', '&':
				b = append(b, `\u00`...)
				b = append(b, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&0xf])
			default:
				b = append(b, c)
			}
		}
		return append(b, '"'), true
	case json.Number:
		return append(b, v...), true
	case []any:
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			if b, ok = appendJSON(b, e); !ok {
				return nil, false
			}
		}
		return append(b, ']'), true
	case yamlMap:
		b = append(b, '{')
		sorted := slices.SortedFunc(slices.Values(v), func(x, y yamlPair) int { return strings.Compare(x.key, y.key) })
		for i, p := range sorted {
			if i > 0 {
				b = append(b, ',')
			}
			b, _ = appendJSON(b, p.key)
			b = append(b, ':')
			if b, ok = appendJSON(b, p.val); !ok {
				return nil, false
			}
		}
		return append(b, '}'), true
	}
	return nil, false
}

// yamlMap is a mapping of the subset: its keys with their values, in the order written.
// The subset's mappings are small (an object's fields, a few labels), which a slice holds
// in less memory than a map, and searches as fast.
type yamlMap []yamlPair

// yamlPair is a key of a mapping and its value.
type yamlPair struct {
	key string
	val any
}

// get returns the value of key.
func (m yamlMap) get(key string) (any, bool) {
	for _, p := range m {
		if p.key == key {
			return p.val, true
		}
	}
	return nil, false
}

// mapBuilder collects the pairs of a mapping and refuses a duplicate key: it scans the
// pairs while they are few, and keeps an index of the keys once they are more than
// indexKeysAbove, so that a long mapping costs no more than a map would.
type mapBuilder struct {
	m    yamlMap
	keys map[string]struct{}
}

// indexKeysAbove is how many keys a mapping holds before mapBuilder indexes them.
const indexKeysAbove = 16

// has reports whether the mapping has key already.
func (b *mapBuilder) has(key string) bool {
	if b.keys != nil {
		_, ok := b.keys[key]
		return ok
	}
	_, ok := b.m.get(key)
	return ok
}

// add adds key, which the mapping does not have, with its value.
func (b *mapBuilder) add(key string, v any) {
	switch {
	case b.keys != nil:
		b.keys[key] = struct{}{}
	case len(b.m) == indexKeysAbove:
		b.keys = make(map[string]struct{}, 2*indexKeysAbove)
		for _, p := range b.m {
			b.keys[p.key] = struct{}{}
		}
		b.keys[key] = struct{}{}
	}
	b.m = append(b.m, yamlPair{key, v})
}

// yamlSubset parses the lines of one document in the subset simpleYAMLToJSON takes.
type yamlSubset struct {
	lines []subsetLine
	pos   int
}

// subsetLine is one line that is not blank or a comment: its indentation and the rest,
// without trailing spaces.
type subsetLine struct {
	indent int
	text   string
}

// mapping parses the block mapping whose keys start at column indent, from the current line.
func (p *yamlSubset) mapping(indent int) (yamlMap, bool) {
	// Most mappings of the subset have a few keys: room for four at once saves the
	// first growths.
	b := mapBuilder{m: make(yamlMap, 0, 4)}
	for p.pos < len(p.lines) {
		l := p.lines[p.pos]
		if l.indent < indent {
			break
		}
		if l.indent > indent || strings.HasPrefix(l.text, "-") {
			return nil, false
		}
		key, rest, found := strings.Cut(l.text, ":")
		if !found || !plainKey(key) || (rest != "" && rest[0] != ' ') {
			return nil, false
		}
		if b.has(key) {
			return nil, false
		}
		p.pos++
		rest = strings.TrimLeft(rest, " ")
		var (
			v  any
			ok bool
		)
		if rest == "" {
			v, ok = p.nested(indent)
		} else {
			v, ok = inlineValue(rest)
		}
		if !ok {
			return nil, false
		}
		b.add(key, v)
	}
	return b.m, true
}

// nested parses the value of a key at column indent whose line ends after the colon: a
// block indented further, or a sequence at the key's own column.
func (p *yamlSubset) nested(indent int) (any, bool) {
	if p.pos >= len(p.lines) {
		return nil, false // null
	}
	l := p.lines[p.pos]
	switch {
	case l.indent == indent && isItem(l.text):
		return p.sequence(indent)
	case l.indent <= indent:
		return nil, false // null
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
func (p *yamlSubset) sequence(indent int) ([]any, bool) {
	s := []any{}
	for p.pos < len(p.lines) {
		l := p.lines[p.pos]
		if l.indent < indent || (l.indent == indent && !isItem(l.text)) {
			break
		}
		if l.indent > indent || !strings.HasPrefix(l.text, "- ") {
			return nil, false
		}
		item := l.text[2:]
		if item == "" || item[0] == ' ' || item[0] == '-' {
			return nil, false
		}
		if key, _, found := strings.Cut(item, ":"); found && plainKey(key) {
			// A mapping that starts on the dash's line, its keys at the column after "- ".
			p.lines[p.pos] = subsetLine{indent: indent + 2, text: item}
			m, ok := p.mapping(indent + 2)
			if !ok {
				return nil, false
			}
			s = append(s, m)
			continue
		}
		v, ok := inlineValue(item)
		if !ok {
			return nil, false
		}
		s = append(s, v)
		p.pos++
	}
	return s, true
}

// inlineValue parses a value written on the line of its key or dash: a scalar, or a
// flow mapping or sequence on that one line (`{name: r1, nodes: [host-a]}`, as
// generators write them) of scalars and of flow collections.
func inlineValue(text string) (any, bool) {
	if text[0] != '[' && text[0] != '{' {
		return scalar(text)
	}
	f := flow{text: text}
	v, ok := f.node()
	f.space()
	return v, ok && f.i == len(text)
}

// maxFlowDepth bounds how deep flow collections nest in the subset.
const maxFlowDepth = 16

// flow parses flow collections within one line, the subset of them whose keys are plain
// keys followed by ": ", whose plain scalars hold no colon, and whose collections end
// without a trailing comma; anything else is left to YAMLToJSONStrict.
type flow struct {
	text string
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
func (f *flow) node() (any, bool) {
	f.space()
	if f.i == len(f.text) {
		return nil, false
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
func (f *flow) collection(end byte) (any, bool) {
	if f.depth++; f.depth > maxFlowDepth {
		return nil, false
	}
	defer func() { f.depth-- }()
	f.i++ // the opening bracket
	var (
		m mapBuilder
		s = []any{}
	)
	if end == '}' {
		m.m = make(yamlMap, 0, 4)
	}
	f.space()
	if f.i < len(f.text) && f.text[f.i] == end {
		f.i++
		if end == '}' {
			return yamlMap{}, true
		}
		return s, true
	}
	for {
		f.space()
		var key string
		if end == '}' {
			start := f.i
			for f.i < len(f.text) && (isLetter(f.text[f.i]) || isDigit(f.text[f.i]) || f.text[f.i] == '_') {
				f.i++
			}
			key = f.text[start:f.i]
			if !plainKey(key) || !strings.HasPrefix(f.text[f.i:], ": ") {
				return nil, false
			}
			if m.has(key) {
				return nil, false
			}
			f.i += 2
		}
		v, ok := f.node()
		if !ok {
			return nil, false
		}
		if end == '}' {
			m.add(key, v)
		} else {
			s = append(s, v)
		}
		f.space()
		if f.i == len(f.text) {
			return nil, false
		}
		switch f.text[f.i] {
		case ',':
			f.i++
		case end:
			f.i++
			if end == '}' {
				return m.m, true
			}
			return s, true
		default:
			return nil, false
		}
	}
}

// scalar parses a scalar within a flow collection: quoted, up to its closing quote, or
// plain, up to the next comma or bracket.
func (f *flow) scalar() (any, bool) {
	start := f.i
	if q := f.text[f.i]; q == '"' || q == '\'' {
		n := strings.IndexByte(f.text[f.i+1:], q)
		if n < 0 {
			return nil, false
		}
		f.i += n + 2
		return scalar(f.text[start:f.i])
	}
	for f.i < len(f.text) && strings.IndexByte(",[]{}", f.text[f.i]) < 0 {
		if f.text[f.i] == ':' {
			// A key, or a colon YAML reads differently in flow context.
			return nil, false
		}
		f.i++
	}
	return scalar(strings.TrimRight(f.text[start:f.i], " "))
}

// scalar parses a scalar: a quoted string without escapes, a decimal integer, or a plain
// string that YAML cannot read as anything else.
func scalar(text string) (any, bool) {
	if text == "" {
		return nil, false
	}
	switch q := text[0]; q {
	case '"', '\'':
		if len(text) < 2 || text[len(text)-1] != q {
			return nil, false
		}
		s := text[1 : len(text)-1]
		if strings.ContainsAny(s, `"'\`) {
			return nil, false
		}
		return s, true
	}
	for i := 0; i < len(text); i++ {
		if !plainByte(text[i]) {
			return nil, false
		}
	}
	if strings.HasSuffix(text, ":") || strings.Contains(text, ": ") {
		return nil, false
	}
	c := text[0]
	switch {
	case isLetter(c):
		if yamlWord(text) {
			return nil, false
		}
		return text, true
	case c >= '0' && c <= '9':
		if isDigits(text) {
			if len(text) > 18 || (len(text) > 1 && c == '0') {
				return nil, false
			}
			return json.Number(text), true
		}
		// Not an integer, float or timestamp: a prefix or an address.
		if strings.ContainsAny(text, "- _") || !(strings.Contains(text, "/") || strings.Count(text, ".") >= 2) {
			return nil, false
		}
		return text, true
	}
	return nil, false
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
// null, in any case.
func yamlWord(s string) bool {
	if len(s) > len("false") {
		return false
	}
	switch strings.ToLower(s) {
	case "y", "yes", "n", "no", "true", "false", "on", "off", "null":
		return true
	}
	return false
}

// plainByte reports whether c may appear in a plain scalar of the subset.
func plainByte(c byte) bool {
	return isLetter(c) || (c >= '0' && c <= '9') || strings.IndexByte("._/:- ", c) >= 0
}

// isLetter reports whether c is an ASCII letter.
func isLetter(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

// isDigit reports whether c is a decimal digit.
func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// isDigits reports whether s is all decimal digits.
func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

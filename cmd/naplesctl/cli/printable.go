package cli

import (
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf16"
	"unicode/utf8"
)

// Printable returns s with every character that a terminal would act on, rather than
// show, written as an escape: control characters (C0 but newline and tab, DEL, C1),
// other characters strconv.IsPrint does not take (bidirectional overrides, line and
// paragraph separators), and bytes that are not UTF-8. "\x1b[2J", which clears a
// terminal, comes out as `\x1b[2J` (C0 as Go quotes them); DEL as `\u007f` and U+009B as
// `\u009b` (the others as JSON escapes them, so that JSON output stays JSON); a stray
// 0xff byte as `\xff`. It returns s itself when nothing needs escaping.
//
// Every human-readable output of naplesctl goes through it: what a node or nimbus sends
// (names, messages, reasons, operational data, labels) must not drive the terminal of the
// operator who reads it (CVE-2021-25743 was kubectl's case). Tables escape each cell
// before aligning them, and the streams naplesctl writes to escape whatever reaches them
// (printableWriter), so nothing is left out.
func Printable(s string) string {
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if !keep(r, size) {
			break
		}
		i += size
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case keep(r, size):
			b.WriteString(s[i : i+size])
		case r == utf8.RuneError && size == 1:
			writeHex(&b, `\x`, uint16(s[i]), 2)
		case r < 0x20:
			q := strconv.QuoteRune(r) // '\x1b', '\r'
			b.WriteString(q[1 : len(q)-1])
		default:
			// \u escapes, UTF-16 surrogates beyond the BMP, as JSON writes them: in the
			// JSON output, which holds such characters in strings only, they read back as
			// they were.
			if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
				writeHex(&b, `\u`, uint16(r1), 4)
				r = r2
			}
			writeHex(&b, `\u`, uint16(r), 4)
		}
		i += size
	}
	return b.String()
}

// writeHex writes prefix and v in digits lower-case hexadecimal digits.
func writeHex(b *strings.Builder, prefix string, v uint16, digits int) {
	const hex = "0123456789abcdef"
	b.WriteString(prefix)
	for shift := 4 * (digits - 1); shift >= 0; shift -= 4 {
		b.WriteByte(hex[v>>shift&0xf])
	}
}

// keep reports whether the rune r, decoded from size bytes, is shown as it is.
func keep(r rune, size int) bool {
	switch {
	case r == '\n' || r == '\t':
		return true
	case r < utf8.RuneSelf:
		return r >= 0x20 && r != 0x7f
	case r == utf8.RuneError && size == 1:
		return false
	}
	return strconv.IsPrint(r)
}

// printableWriter writes to w what is written to it, through Printable. Each Write is
// escaped on its own: a character split across two writes is escaped byte by byte, which
// shows it wrongly but safely; fmt and text/tabwriter write whole strings and cells.
type printableWriter struct{ w io.Writer }

// printable returns w wrapped in a printableWriter, unless it is one.
func printable(w io.Writer) io.Writer {
	if _, ok := w.(printableWriter); ok {
		return w
	}
	return printableWriter{w}
}

// raw returns the writer w escapes for, or w when it is no printableWriter: for what
// naplesctl itself writes to drive a terminal, as apply --wait's progress line does.
func raw(w io.Writer) io.Writer {
	if pw, ok := w.(printableWriter); ok {
		return pw.w
	}
	return w
}

// Write writes p, escaped, and returns len(p) when all of it was written.
func (pw printableWriter) Write(p []byte) (int, error) {
	s := Printable(string(p))
	if len(s) == len(p) {
		return pw.w.Write(p)
	}
	if _, err := io.WriteString(pw.w, s); err != nil {
		return 0, err
	}
	return len(p), nil
}

// table is a text/tabwriter.Writer whose input goes through Printable, so that every
// cell is escaped before it is measured and the columns line up as shown.
type table struct {
	printableWriter
	tw *tabwriter.Writer
}

// newTable returns a table that writes to w, with columns padding spaces apart.
func newTable(w io.Writer, padding int) *table {
	tw := tabwriter.NewWriter(w, 0, 8, padding, ' ', 0)
	return &table{printableWriter: printableWriter{tw}, tw: tw}
}

// Flush writes the table out.
func (t *table) Flush() error { return t.tw.Flush() }

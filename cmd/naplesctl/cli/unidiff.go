package cli

import (
	"fmt"
	"strings"
)

// maxDiffCells bounds the table of the longest common subsequence unifiedDiff builds of
// the lines that differ between two texts, once their common first and last lines are
// set aside: 4 bytes a cell. Texts that differ in more shows as the lines of one
// removed and the other's added, which is a true diff, if not the shortest.
const maxDiffCells = 1 << 22

// editOp is one step of an edit script: a line of both texts, of the first only, or of
// the second only.
type editOp byte

const (
	opEqual  editOp = ' '
	opDelete editOp = '-'
	opInsert editOp = '+'
)

// edit is one line of an edit script, with its kind and its text.
type edit struct {
	op   editOp
	line string
}

// unifiedDiff returns the hunks of the unified diff from the lines a to the lines b with
// context unchanged lines around each change, as diff -u writes them after its header:
// "@@ -3,7 +3,8 @@" then the lines, " " unchanged, "-" removed, "+" added. Empty when a
// and b are the same.
func unifiedDiff(a, b []string, context int) string {
	script := editScript(a, b)
	var out strings.Builder
	// Positions in script of the hunk under way, and the line numbers, from 1, of its
	// first line in a and in b.
	for start := 0; start < len(script); {
		// The next change, and the hunk that starts context lines before it.
		first := start
		for first < len(script) && script[first].op == opEqual {
			first++
		}
		if first == len(script) {
			break
		}
		from := max(first-context, start)
		// The hunk ends context lines after its last change that is followed by more
		// than 2*context unchanged lines, or by the end.
		end := first
		for i := first; i < len(script); {
			if script[i].op != opEqual {
				i++
				end = i
				continue
			}
			run := i
			for run < len(script) && script[run].op == opEqual {
				run++
			}
			if run == len(script) || run-i > 2*context {
				break
			}
			i = run
		}
		to := min(end+context, len(script))
		writeHunk(&out, script, from, to)
		start = to
	}
	return out.String()
}

// writeHunk writes the hunk of the script's edits [from, to) with its header.
func writeHunk(out *strings.Builder, script []edit, from, to int) {
	// Line numbers, from 1, of the hunk's first line in each text.
	aLine, bLine := 1, 1
	for _, e := range script[:from] {
		if e.op != opInsert {
			aLine++
		}
		if e.op != opDelete {
			bLine++
		}
	}
	aLen, bLen := 0, 0
	for _, e := range script[from:to] {
		if e.op != opInsert {
			aLen++
		}
		if e.op != opDelete {
			bLen++
		}
	}
	fmt.Fprintf(out, "@@ -%s +%s @@\n", hunkRange(aLine, aLen), hunkRange(bLine, bLen))
	for _, e := range script[from:to] {
		out.WriteByte(byte(e.op))
		out.WriteString(e.line)
		out.WriteByte('\n')
	}
}

// hunkRange is a hunk header's range of lines of one text, as diff -u writes it: "3,7",
// "3" for one line, "2,0" for none after line 2.
func hunkRange(line, n int) string {
	switch n {
	case 0:
		return fmt.Sprintf("%d,0", line-1)
	case 1:
		return fmt.Sprint(line)
	}
	return fmt.Sprintf("%d,%d", line, n)
}

// editScript returns a shortest edit script from a to b: their common first and last
// lines unchanged, and between them the lines of a longest common subsequence unchanged,
// the others removed or added, the removed ones first where a change does both. When the
// lines between are more than maxDiffCells apart, they are all removed and added.
func editScript(a, b []string) []edit {
	prefix := 0
	for prefix < len(a) && prefix < len(b) && a[prefix] == b[prefix] {
		prefix++
	}
	suffix := 0
	for suffix < len(a)-prefix && suffix < len(b)-prefix && a[len(a)-1-suffix] == b[len(b)-1-suffix] {
		suffix++
	}
	script := make([]edit, 0, len(a)+len(b))
	for _, l := range a[:prefix] {
		script = append(script, edit{opEqual, l})
	}
	am, bm := a[prefix:len(a)-suffix], b[prefix:len(b)-suffix]
	n, m := len(am), len(bm)
	if (n+1)*(m+1) > maxDiffCells {
		for _, l := range am {
			script = append(script, edit{opDelete, l})
		}
		for _, l := range bm {
			script = append(script, edit{opInsert, l})
		}
	} else {
		// lcs[i*(m+1)+j] is the length of a longest common subsequence of am[i:] and bm[j:].
		lcs := make([]int32, (n+1)*(m+1))
		for i := n - 1; i >= 0; i-- {
			for j := m - 1; j >= 0; j-- {
				if am[i] == bm[j] {
					lcs[i*(m+1)+j] = lcs[(i+1)*(m+1)+j+1] + 1
				} else {
					lcs[i*(m+1)+j] = max(lcs[(i+1)*(m+1)+j], lcs[i*(m+1)+j+1])
				}
			}
		}
		i, j := 0, 0
		for i < n || j < m {
			switch {
			case i < n && j < m && am[i] == bm[j]:
				script = append(script, edit{opEqual, am[i]})
				i++
				j++
			case j == m || (i < n && lcs[(i+1)*(m+1)+j] >= lcs[i*(m+1)+j+1]):
				script = append(script, edit{opDelete, am[i]})
				i++
			default:
				script = append(script, edit{opInsert, bm[j]})
				j++
			}
		}
	}
	for _, l := range a[len(a)-suffix:] {
		script = append(script, edit{opEqual, l})
	}
	return script
}

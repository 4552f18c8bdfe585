//go:build unix

package pki

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// otherGID returns a group other than the process's own that it may give its files:
// any group as root, else one of its supplementary groups. It skips the test when there
// is none.
func otherGID(t *testing.T) int {
	t.Helper()
	if os.Geteuid() == 0 {
		return os.Getegid() + 1
	}
	groups, err := os.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		if g != os.Getegid() {
			return g
		}
	}
	t.Skip("no group to give a file to: run as root, or as a member of a second group")
	return 0
}

// TestReplaceFilesKeepsGroup replaces pairs whose key the group reads (0640), the group
// and others read (0644) and no one else reads (0600), each with its files in another
// group: the new files keep the group, and the key the group's read permission alone,
// while WriteFiles writes a private key of the process's group.
func TestReplaceFilesKeepsGroup(t *testing.T) {
	ca := newCA(t)
	gid := otherGID(t)
	for _, tc := range []struct {
		was, want os.FileMode
	}{{0o640, 0o640}, {0o644, 0o640}, {0o600, 0o600}} {
		dir := t.TempDir()
		certPath, keyPath := filepath.Join(dir, "nimbus.crt"), filepath.Join(dir, "nimbus.key")
		if err := must[KeyPair](t)(ca.IssueServer(nil, CertOptions{})).WriteFiles(certPath, keyPath); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{certPath, keyPath} {
			if err := os.Chown(p, -1, gid); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(keyPath, tc.was); err != nil {
			t.Fatal(err)
		}
		if err := must[KeyPair](t)(ca.IssueServer(nil, CertOptions{})).ReplaceFiles(certPath, keyPath); err != nil {
			t.Fatalf("ReplaceFiles: %v", err)
		}
		for p, want := range map[string]os.FileMode{keyPath: tc.want, certPath: 0o644} {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if g := int(fi.Sys().(*syscall.Stat_t).Gid); fi.Mode().Perm() != want || g != gid {
				t.Errorf("a key of mode %04o replaced: %s has mode %04o and group %d, want %04o and %d", tc.was, filepath.Base(p), fi.Mode().Perm(), g, want, gid)
			}
		}
		if err := must[KeyPair](t)(ca.IssueServer(nil, CertOptions{})).WriteFiles(certPath, keyPath); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(keyPath); err != nil || fi.Mode().Perm() != 0o600 || int(fi.Sys().(*syscall.Stat_t).Gid) != os.Getegid() {
			t.Errorf("WriteFiles over a key of mode %04o: %v, %v; want mode 0600 and the process's group %d", tc.was, fi.Mode(), err, os.Getegid())
		}
	}
}

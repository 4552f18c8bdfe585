package pki

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestExpiryWarnings(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	ca := must[*CA](t)(NewCA(CAOptions{Validity: 90 * 24 * time.Hour}))
	soon := must[KeyPair](t)(ca.IssueNode("host-a", CertOptions{Validity: 10*24*time.Hour + time.Hour}))
	caCert, caKey := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	nodeCert, nodeKey := filepath.Join(dir, "host-a.crt"), filepath.Join(dir, "host-a.key")
	if err := ca.WriteFiles(caCert, caKey); err != nil {
		t.Fatal(err)
	}
	if err := soon.WriteFiles(nodeCert, nodeKey); err != nil {
		t.Fatal(err)
	}
	e, err := ReadExpiry(CertFile{Use: UseClient, Path: nodeCert}, CertFile{Use: UseCA, Path: caCert})
	if err != nil {
		t.Fatal(err)
	}
	got := e.Certificates()
	if len(got) != 2 || !got[0].NotAfter.Equal(soon.Cert.NotAfter) || !got[1].NotAfter.Equal(ca.Cert.NotAfter) || got[1].Use != UseCA {
		t.Fatalf("Certificates() = %+v, want the node's NotAfter %v then the CA's %v", got, soon.Cert.NotAfter, ca.Cert.NotAfter)
	}

	w := e.Warnings(now, DefaultExpiryWarning)
	want := "warning: certificate " + nodeCert + " expires in 10 days (" + soon.Cert.NotAfter.UTC().Format(time.RFC3339) + ")"
	if len(w) != 1 || w[0] != want {
		t.Errorf("Warnings within 30 days = %q, want only %q", w, want)
	}
	if w := e.Warnings(now, 24*time.Hour); len(w) != 0 {
		t.Errorf("Warnings within a day = %q, want none", w)
	}
	if w := e.Warnings(now, 100*24*time.Hour); len(w) != 2 {
		t.Errorf("Warnings within 100 days = %q, want both files", w)
	}
	if w := e.Warnings(now.Add(12*24*time.Hour), DefaultExpiryWarning); len(w) != 1 || !strings.Contains(w[0], nodeCert+" expired 1 day ago") {
		t.Errorf("Warnings 12 days on = %q, want the node certificate expired", w)
	}
	var none *Expiry
	if w := none.Warnings(now, DefaultExpiryWarning); w != nil {
		t.Errorf("nil Expiry warns %q", w)
	}
	if _, err := ReadExpiry(CertFile{Use: UseServer, Path: filepath.Join(dir, "missing.crt")}); err == nil || !strings.Contains(err.Error(), "missing.crt") {
		t.Errorf("ReadExpiry of a missing file = %v, want an error naming it", err)
	}
}

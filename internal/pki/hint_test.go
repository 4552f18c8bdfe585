package pki

import (
	"errors"
	"strings"
	"testing"
)

func TestDialHint(t *testing.T) {
	for _, tc := range []struct {
		err      string
		usingTLS bool
		want     string
	}{
		{`connection error: desc = "error reading server preface: EOF"`, false, "drop --insecure"},
		{`transport: failed to write client preface: write unix @->/run/n.sock: write: broken pipe`, false, "drop --insecure"},
		{`transport: authentication handshake failed: tls: first record does not look like a TLS handshake`, true, "give --insecure here too"},
		{`transport: failed to write client preface: write unix @->/run/n.sock: write: broken pipe`, true, "--tls-cert and --tls-key"},
		{`error reading server preface: remote error: tls: unknown certificate authority`, true, "--tls-cert must be issued by a CA of nimbus's --tls-ca"},
		{`error reading server preface: remote error: tls: bad certificate`, true, "revoked (nimbus's --tls-crl)"},
		{`error reading server preface: remote error: tls: expired certificate`, true, "naplesctl certs --renew"},
		{`tls: failed to verify certificate: x509: certificate signed by unknown authority`, true, "with --tls-ca"},
		{`x509: certificate is valid for nimbus, not other`, true, "--tls-server-name"},
		{`transport: Error while dialing: dial unix /run/naples/nimbus.sock: connect: permission denied`, true, "usermod -aG naples"},
		{`transport: Error while dialing: dial unix /run/naples/nimbus.sock: connect: permission denied`, false, "--socket-group"},
		{`connection refused`, true, ""},
		{`connection refused`, false, ""},
	} {
		got := DialHint(errors.New(tc.err), tc.usingTLS)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("DialHint(%q, tls %v) = %q, want it to say %q", tc.err, tc.usingTLS, got, tc.want)
		}
	}
}

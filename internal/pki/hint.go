package pki

import "strings"

// DialHint returns what a failed connection to nimbus most likely means, and which flag
// mends it, for an error that gRPC reports when the TLS handshake between a client and
// nimbus fails or one side speaks plaintext to the other: `error reading server preface:
// EOF`, `broken pipe`, `first record does not look like a TLS handshake`, a TLS alert or
// a certificate that does not verify; and when the client may not open nimbus's unix
// socket, which group lets it. It returns "" for any other error. usingTLS tells
// whether the client dialed with TLS. The flags are those naplesctl and naples-agent
// share: --insecure, --tls-cert, --tls-key, --tls-ca and --tls-server-name.
func DialHint(err error, usingTLS bool) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	has := func(parts ...string) bool {
		for _, p := range parts {
			if strings.Contains(msg, p) {
				return true
			}
		}
		return false
	}
	switch {
	case has("connect: permission denied"):
		return "this user may not open nimbus's unix socket, which nimbus gives to the group of its --socket-group " +
			"(naples by default): join that group (usermod -aG naples USER, effective at the next login)"
	case !usingTLS && has("error reading server preface", "broken pipe", "connection reset by peer", "failed to write client preface"):
		return "nimbus closed this plaintext connection, as one that serves TLS does: drop --insecure and give " +
			"--tls-cert, --tls-key and --tls-ca (or serve nimbus with --insecure)"
	case !usingTLS:
	case has("first record does not look like a TLS handshake"):
		return "nimbus answered in plaintext: it serves with --insecure, so give --insecure here too (or serve nimbus with TLS)"
	case has("certificate signed by unknown authority"):
		return "nimbus's certificate is not issued by a CA of --tls-ca: give the CA that issued it with --tls-ca"
	case has("certificate is valid for", "certificate is not valid for"):
		return "nimbus's certificate does not carry the name this client verifies: set --tls-server-name to one it carries"
	case has("unknown certificate authority", "certificate unknown"):
		return "nimbus does not trust this client's certificate: --tls-cert must be issued by a CA of nimbus's --tls-ca"
	case has("expired certificate"):
		return "nimbus refused this client's certificate as expired or not valid yet: renew --tls-cert (naplesctl certs --renew)"
	case has("bad certificate"):
		return "nimbus refused this client's certificate: it is revoked (nimbus's --tls-crl) or not a client certificate; " +
			"give a --tls-cert that naplesctl certs issued for a node or publisher and did not revoke"
	case has("certificate required", "broken pipe", "error reading server preface", "connection reset by peer"):
		return "nimbus closed the connection during the TLS handshake, as it does when a client sends no certificate " +
			"or one it does not trust: give --tls-cert and --tls-key issued by a CA of nimbus's --tls-ca"
	}
	return ""
}

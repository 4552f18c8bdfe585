package pki

import (
	"crypto/tls"
	"testing"
)

func TestTransportCredentials(t *testing.T) {
	if got := TransportCredentials(nil).Info().SecurityProtocol; got != "insecure" {
		t.Errorf("TransportCredentials(nil) speaks %q, want insecure", got)
	}
	if got := TransportCredentials(&tls.Config{MinVersion: tls.VersionTLS13}).Info().SecurityProtocol; got != "tls" {
		t.Errorf("TransportCredentials(cfg) speaks %q, want tls", got)
	}
}

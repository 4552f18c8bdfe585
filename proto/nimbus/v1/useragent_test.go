package nimbusv1

import (
	"strings"
	"testing"
)

func TestAgentVersion(t *testing.T) {
	long := strings.Repeat("v", 100)
	for ua, want := range map[string]string{
		AgentUserAgent("v1.2.0") + " grpc-go/1.85.0": "v1.2.0",
		"grpc-go/1.85.0 " + AgentUserAgent("dev"):    "dev",
		"grpc-go/1.85.0":     "",
		"naples-agentx/v1":   "",
		"":                   "",
		AgentUserAgent(long): long[:64],
	} {
		if got := AgentVersion(ua); got != want {
			t.Errorf("AgentVersion(%q) = %q, want %q", ua, got, want)
		}
	}
}

package nimbusv1

import "strings"

// AgentProduct is the product token of the naples agent's gRPC user agent,
// "naples-agent/VERSION": nimbus reads the version of the agents that watch it from it.
const AgentProduct = "naples-agent"

// maxAgentVersionBytes bounds the version AgentVersion returns; a longer one is cut.
const maxAgentVersionBytes = 64

// AgentUserAgent returns the gRPC user agent of an agent of the version.
func AgentUserAgent(version string) string { return AgentProduct + "/" + version }

// AgentVersion returns the version a gRPC user agent names for the agent, "" when it names
// none. gRPC appends its own token ("naples-agent/v1.2.0 grpc-go/1.85.0"), which is
// skipped; a version longer than 64 bytes is cut to 64.
func AgentVersion(userAgent string) string {
	for _, token := range strings.Fields(userAgent) {
		if v, ok := strings.CutPrefix(token, AgentProduct+"/"); ok {
			if len(v) > maxAgentVersionBytes {
				v = strings.ToValidUTF8(v[:maxAgentVersionBytes], "")
			}
			return v
		}
	}
	return ""
}

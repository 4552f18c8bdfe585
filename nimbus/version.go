package nimbus

import (
	"context"
	"runtime"

	"github.com/naplesnet/naples/internal/version"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Version answers which naples version the Server runs, the Go release it was built with
// and its platform, as `nimbus --version` prints them. It answers even while the store is
// not ready, and anyone with a certificate the CAs issued may call it (see auth.go).
func (s *Server) Version(context.Context, *nimbusv1.VersionRequest) (*nimbusv1.VersionResponse, error) {
	return &nimbusv1.VersionResponse{
		Version:   version.Get(),
		GoVersion: runtime.Version(),
		Platform:  runtime.GOOS + "/" + runtime.GOARCH,
	}, nil
}

//go:build !linux

package agent

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
)

// dataplane reports that only Linux hosts have an overlay dataplane to read.
func (i *Inspector) dataplane(context.Context) (*delphiv1.DataplaneResponse, error) {
	return nil, status.Error(codes.Unimplemented, "the dataplane view reads Linux kernels only")
}

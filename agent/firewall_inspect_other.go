//go:build !linux

package agent

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
)

// firewall reports that only Linux hosts have a firewall to read.
func (i *Inspector) firewall(context.Context, delphiv1.FirewallView) (*delphiv1.FirewallResponse, error) {
	return nil, status.Error(codes.Unimplemented, "the firewall view reads Linux kernels only")
}

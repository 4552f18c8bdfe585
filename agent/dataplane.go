package agent

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
)

// errNoNode is returned by Dataplane when the Inspector does not know this host's node name.
var errNoNode = status.Error(codes.FailedPrecondition,
	"the dataplane view needs this host's node name, and the local api was started without it")

// Dataplane returns the overlay dataplane of this host as the agent sees it. For every
// Network in delphi that targets this node it gives what delphi wants (VNI, MTU, subnets
// and gateways), this node's status of it, and what the kernel of the namespace the HAL
// programs has: the network's bridge and VXLAN device, named and marked as hal/linux's
// overlay names them, its head-end replication entries, and for each of its endpoints in
// delphi, with their status, either the host-side interface that must be a port of the
// bridge (an endpoint on this node) or the FDB and neighbour entries that reach it (an
// endpoint on another node). Each kernel object that differs from what naples wants says
// how. The kernel is read once per call through the kernel view the HAL's reconcilers
// share, one read per kind (links, bridge ports, addresses, FDB, neighbours), never per
// object, and each netlink exchange is bounded by what is left of the call's deadline,
// at most 10s.
func (i *Inspector) Dataplane(ctx context.Context, _ *delphiv1.DataplaneRequest) (*delphiv1.DataplaneResponse, error) {
	if i.node == "" {
		return nil, errNoNode
	}
	resp, err := i.dataplane(ctx)
	if err == nil {
		return resp, nil
	}
	if _, ok := status.FromError(err); ok {
		return nil, err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil, status.FromContextError(err).Err()
	}
	return nil, status.Errorf(codes.Internal, "reading the dataplane: %v", err)
}

package agent

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
)

// errNoFirewall is returned by Firewall when the agent runs without a firewall.
var errNoFirewall = status.Error(codes.FailedPrecondition,
	"the agent runs without a firewall (--bpf-dir is empty), so there are no firewall maps to read")

// errFirewallNoNode is returned by Firewall when the Inspector does not know this host's
// node name, which tells its endpoints.
var errFirewallNoNode = status.Error(codes.FailedPrecondition,
	"the firewall view needs this host's node name, and the local api was started without it")

// Firewall returns what the eBPF firewall's maps, pinned in the agent's --bpf-dir, hold:
// a summary of the snapshot in place and the program's counters, and, as the request's
// view asks, the endpoint, subject and policy entries with the rule counters, the
// identities of each tenant scope, or the live connections. The ids in the maps are
// named by the snapshot the firewall installed last (InspectorOptions.Firewall), which
// holds the ids it wrote, also after a capacity left a policy out; an id it does not know,
// or any id before the firewall installed a snapshot, is reported raw. The maps are opened read-only for the call and
// read once; no program is loaded and nothing is changed. It fails with
// codes.FailedPrecondition when the agent runs without a firewall or the maps are not
// pinned yet.
func (i *Inspector) Firewall(ctx context.Context, req *delphiv1.FirewallRequest) (*delphiv1.FirewallResponse, error) {
	if i.bpfDir == "" {
		return nil, errNoFirewall
	}
	if i.node == "" {
		return nil, errFirewallNoNode
	}
	if _, ok := delphiv1.FirewallView_name[int32(req.GetView())]; !ok {
		return nil, status.Errorf(codes.InvalidArgument, "view %d: not a firewall view", req.GetView())
	}
	resp, err := i.firewall(ctx, req.GetView())
	if err == nil {
		return resp, nil
	}
	if _, ok := status.FromError(err); ok {
		return nil, err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil, status.FromContextError(err).Err()
	}
	return nil, status.Errorf(codes.Internal, "reading the firewall: %v", err)
}

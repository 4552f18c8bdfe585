package nimbusv1

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// ListAll lists every object the request selects: it asks for one page after the other,
// each with the next_page_token of the one before, and returns their items together, with
// the revision of the last page. The request is not modified.
func ListAll(ctx context.Context, api NimbusClient, req *ListRequest, opts ...grpc.CallOption) (*ListResponse, error) {
	req = proto.CloneOf(req)
	all := &ListResponse{}
	for {
		resp, err := api.List(ctx, req, opts...)
		if err != nil {
			return nil, err
		}
		all.Items = append(all.Items, resp.GetItems()...)
		all.Revision = resp.GetRevision()
		if resp.GetNextPageToken() == "" {
			return all, nil
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

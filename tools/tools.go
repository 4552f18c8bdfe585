//go:build tools

// Package tools pins the code generators used by `make proto`.
package tools

import (
	_ "github.com/bufbuild/buf/cmd/buf"
	_ "github.com/goreleaser/nfpm/v2/cmd/nfpm"
	_ "github.com/planetscale/vtprotobuf/cmd/protoc-gen-go-vtproto"
	_ "google.golang.org/grpc/cmd/protoc-gen-go-grpc"
	_ "google.golang.org/protobuf/cmd/protoc-gen-go"
)

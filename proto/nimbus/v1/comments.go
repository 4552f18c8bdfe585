package nimbusv1

import "google.golang.org/protobuf/reflect/protoreflect"

// Comment returns the comment of the element of nimbus.proto named name (a message,
// field, oneof, enum, enum value, service or method, such as "nimbus.v1.RouteSpec.prefix"),
// as written above it, or after it when nothing is above, without the comment markers; ""
// when it has none. protoc-gen-go leaves comments out of the descriptors it embeds, so
// `make proto` writes them to nimbusv1_comments.pb.go.
func Comment(name protoreflect.FullName) string { return protoComments[name] }

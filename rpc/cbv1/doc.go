// Package cbv1 is the generated protobuf and gRPC code of the CacheBlend
// protocol (package cacheblend.v1). Do not edit: regenerate with
// `go generate ./rpc/...`.
package cbv1

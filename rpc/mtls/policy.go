package mtls

import (
	"context"
	"maps"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// KVTransferService is the full name of the gRPC service through which a
// decode engine's worker reads the KV of a handed-over request from a
// prefill engine's worker (rpc/worker.proto).
const KVTransferService = "cacheblend.v1.KVTransferService"

// KVTransferCallers are the roles allowed to call a worker's
// KVTransferService: only another worker (read-only).
var KVTransferCallers = []Role{Worker}

// Policy says which roles may call which gRPC service of a server: the
// roles of Services[service] for the services it names, Default for every
// other (the health service included). A Policy is read-only once passed
// to ServerOptionsFor.
type Policy struct {
	// Default are the roles allowed on services Services does not name.
	Default []Role
	// Services maps a service's full name ("package.Service") to the roles
	// allowed to call it.
	Services map[string][]Role
}

// WorkerPolicy is cb worker's policy: its WorkerService (Info, Execute,
// PullKV) and health service admit only the engine (WorkerCallers), its
// KVTransferService only other workers (KVTransferCallers).
func WorkerPolicy() Policy {
	return Policy{Default: slices.Clone(WorkerCallers), Services: map[string][]Role{KVTransferService: slices.Clone(KVTransferCallers)}}
}

// Allowed returns the roles allowed to call the gRPC method fullMethod
// ("/package.Service/Method").
func (p Policy) Allowed(fullMethod string) []Role {
	svc := strings.TrimPrefix(fullMethod, "/")
	if i := strings.LastIndexByte(svc, '/'); i >= 0 {
		svc = svc[:i]
	}
	if r, ok := p.Services[svc]; ok {
		return r
	}
	return p.Default
}

// clone copies p so that later changes to the caller's slices and map do
// not reach the interceptors.
func (p Policy) clone() Policy {
	c := Policy{Default: slices.Clone(p.Default), Services: maps.Clone(p.Services)}
	for k, v := range c.Services {
		c.Services[k] = slices.Clone(v)
	}
	return c
}

// UnaryServerInterceptorFor refuses every unary call whose caller's
// verified certificate does not name a role p allows on the called service
// (see PeerRole for the codes).
func UnaryServerInterceptorFor(p Policy) grpc.UnaryServerInterceptor {
	p = p.clone()
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := authorize(ctx, info.FullMethod, p.Allowed(info.FullMethod)); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptorFor is UnaryServerInterceptorFor for streaming
// calls.
func StreamServerInterceptorFor(p Policy) grpc.StreamServerInterceptor {
	p = p.clone()
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := authorize(ss.Context(), info.FullMethod, p.Allowed(info.FullMethod)); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// ServerOptionsFor is ServerOptions with a per-service policy: mutual TLS
// with this identity, and each call admitted only from the roles p allows
// on its service.
func (id *Identity) ServerOptionsFor(p Policy) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.Creds(credentials.NewTLS(id.ServerTLS())),
		grpc.ChainUnaryInterceptor(UnaryServerInterceptorFor(p)),
		grpc.ChainStreamInterceptor(StreamServerInterceptorFor(p)),
	}
}

package mtls

import (
	"context"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// PeerRole returns the role named by the verified certificate of the caller
// of the gRPC call ctx belongs to. The error is a gRPC status:
// codes.Unauthenticated when the connection is not TLS or carries no
// verified client certificate, codes.PermissionDenied when the certificate
// names no role.
func PeerRole(ctx context.Context) (Role, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", status.Error(codes.Unauthenticated, "mtls: no peer")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return "", status.Error(codes.Unauthenticated, "mtls: not a TLS connection")
	}
	if len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return "", status.Error(codes.Unauthenticated, "mtls: no verified client certificate")
	}
	role, err := RoleOf(ti.State.VerifiedChains[0][0])
	if err != nil {
		return "", status.Error(codes.PermissionDenied, err.Error())
	}
	return role, nil
}

// authorize returns nil when the caller's role is one of allowed, else the
// status error to answer.
func authorize(ctx context.Context, method string, allowed []Role) error {
	role, err := PeerRole(ctx)
	if err != nil {
		return err
	}
	if !slices.Contains(allowed, role) {
		return status.Errorf(codes.PermissionDenied, "mtls: %s may not call %s (allowed: %v)", role, method, allowed)
	}
	return nil
}

// UnaryServerInterceptor refuses every unary call whose caller's verified
// certificate does not name one of the allowed roles (see PeerRole for the
// codes); allowed calls proceed unchanged.
func UnaryServerInterceptor(allowed ...Role) grpc.UnaryServerInterceptor {
	allowed = slices.Clone(allowed)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := authorize(ctx, info.FullMethod, allowed); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor is UnaryServerInterceptor for streaming calls.
func StreamServerInterceptor(allowed ...Role) grpc.StreamServerInterceptor {
	allowed = slices.Clone(allowed)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := authorize(ss.Context(), info.FullMethod, allowed); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

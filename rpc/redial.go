package rpc

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Reconnection bounds of Dial: a restarted peer is reached within about
// ConnectMaxDelay of listening again, however long it was down (gRPC's
// default backoff grows to 120 s; after a few crashes in a row a client
// would wait tens of seconds).
const (
	// ConnectBaseDelay is the first reconnect delay after a failed attempt.
	ConnectBaseDelay = 50 * time.Millisecond
	// ConnectMaxDelay bounds the reconnect delay (before jitter, ±20%).
	ConnectMaxDelay = 500 * time.Millisecond
	// MinConnectTimeout bounds one connection attempt.
	MinConnectTimeout = 2 * time.Second
	// RedialEvery is the most often a failing call resets the backoff.
	RedialEvery = 100 * time.Millisecond
)

// connectParams are the reconnect parameters of every Dial.
var connectParams = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: ConnectBaseDelay, Multiplier: 1.6, Jitter: 0.2, MaxDelay: ConnectMaxDelay},
	MinConnectTimeout: MinConnectTimeout,
}

// redialer resets a connection's reconnect backoff when a call fails with
// Unavailable (the peer is down, or restarted and not yet reconnected), at
// most once per RedialEvery: a health probe that fails (the engine's Info
// probe of its worker, a step, a lookup) makes the next connection attempt
// immediate instead of waiting out the backoff. The zero value is ready.
type redialer struct {
	mu   sync.Mutex
	last time.Time
	now  func() time.Time // time.Now when nil (tests set it)
}

// due reports whether a reset is allowed now, and records it.
func (r *redialer) due() bool {
	now := time.Now
	if r.now != nil {
		now = r.now
	}
	t := now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.last.IsZero() && t.Sub(r.last) < RedialEvery {
		return false
	}
	r.last = t
	return true
}

// unary is the client interceptor: after a call failed with Unavailable it
// resets cc's connect backoff (when due).
func (r *redialer) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err != nil && status.Code(err) == codes.Unavailable && r.due() {
		cc.ResetConnectBackoff()
	}
	return err
}

package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/service"
)

// shutdownTimeout bounds a process's graceful shutdown after SIGINT/SIGTERM.
const shutdownTimeout = 15 * time.Second

// untilSignal is ctx, cancelled at SIGINT or SIGTERM; stop releases the signals.
func untilSignal(ctx context.Context) (_ context.Context, stop context.CancelFunc) {
	return signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
}

// runUntilSignal blocks until SIGINT or SIGTERM (or ctx ends), then shuts the
// components down in order and the runtime last (flushing spans).
func runUntilSignal(ctx context.Context, rt *service.Runtime, comps ...component.Lifecycle) error {
	ctx, stop := untilSignal(ctx)
	defer stop()
	<-ctx.Done()
	rt.Logger.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	var first error
	for _, c := range comps {
		if err := c.Shutdown(sctx); err != nil && first == nil {
			first = err
		}
	}
	if err := rt.Shutdown(sctx); err != nil && first == nil {
		first = err
	}
	if first != nil {
		return fmt.Errorf("shutdown: %w", first)
	}
	return nil
}

// announce prints one machine-readable line on stdout once a process is
// ready, for cb up and scripts: "READY <service> key=value ...".
func announce(service string, kv ...string) {
	line := "READY " + service
	for i := 0; i+1 < len(kv); i += 2 {
		line += " " + kv[i] + "=" + kv[i+1]
	}
	fmt.Println(line)
}

// Package service is the process runtime shared by cb-engine, cb-worker,
// cb-blend and cb-traces: the tracer provider built from OTEL_* / CB_*
// environment (then flag overrides), the Prometheus registry with the
// process instruments, the JSON logger that stamps trace ids, and the
// /metrics + /health HTTP endpoint (bounded by package httpserve; /health
// answers 503 with the reason while a check added by AddHealthCheck fails).
// cmd/cb wires components onto a Runtime:
// Runtime.Deps is the component.Deps every component's New takes.
package service

// Package depcheck holds no code, only a test of the module's dependency
// rules, run with `go list`: the engine links neither the model, gonum, the
// OpenTelemetry SDK nor an exporter; the blend server links neither the model
// nor gonum; package telemetry is the OpenTelemetry API layer (no SDK, no
// exporter) and only process setup imports telemetry/provider; component
// (the shared Deps and lifecycle) links no SDK, exporter or model; tokenizer,
// defaults and contract/spanname are leaf packages, simd (the compute
// kernels) links only golang.org/x/sys/cpu and rope only simd. The test
// fails when a change breaks a rule.
package depcheck

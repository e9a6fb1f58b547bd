// Package contract embeds cacheblend's observability contract and validates it.
//
// Three YAML files, compiled into the binary with go:embed, are the single source of truth
// that code, tests, dashboards and alert generators agree on:
//
//   - instruments.yaml: every metric of the stack (name, type, help, unit, label keys with
//     their allowed values or cap, histogram bucket bounds, owning processes). Package metrics
//     registers instruments only from it.
//   - spans.yaml: the unified trace of one request across cb-engine, cb-worker and cb-blend
//     (span names, owners, parents, kinds, the phase the trace page attributes each span's
//     time to, required attributes and their types, and the conditions under which optional
//     spans are present). Package contract/spanname holds its span names as Go constants,
//     generated from it by `go generate` (see contract/cmd/genspans).
//   - slo.yaml: the service-level objectives over those metrics and the burn-rate alert windows.
//
// [Instruments], [Spans] and [SLOs] parse the embedded files and validate them; the Parse*
// functions do the same for arbitrary input (tests, generators, `cb check` on a file), and
// reject bad input with an error that wraps [ErrInvalid], never a panic. The raw bytes are
// available from [InstrumentsYAML], [SpansYAML] and [SLOYAML] for generators.
//
// Every loader returns a freshly parsed value owned by the caller; the package holds no
// mutable state and all its functions are safe for concurrent use.
package contract

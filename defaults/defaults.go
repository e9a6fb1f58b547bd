// Package defaults holds the settings that more than one process of the
// stack must agree on, defined once: the served model's name, the CacheBlend
// recompute ratio and check layer, and the blend server's chunk size. Each
// package's own Default* constants and flag defaults refer to these.
//
// It also holds Positive, the one rule every Config's zero (or negative)
// fields follow.
//
// It is a leaf package that imports nothing, so that the engine, the worker,
// the model, the blend server and the tools can all import it. It has no
// state; every name is a constant or a pure function, safe to use from any
// goroutine.
package defaults

const (
	// Model is the name of the served model: the engine's /v1/models entry,
	// the model requests must name, the worker's Info and the key of the
	// blend server's per-model fingerprint tables.
	Model = "cb-llama"

	// RecompRatio is the CacheBlend recompute ratio: the share of reused
	// tokens whose KV is recomputed from the check layer on (the engine puts
	// it in CB plans; the model uses it when a plan gives none).
	RecompRatio = 0.15

	// CheckLayer is the CacheBlend check layer cl: layers 0..cl-1 recompute
	// every non-prefix token, layer cl selects the important tokens.
	CheckLayer = 1

	// ChunkSize is the number of tokens per stored chunk of the blend server
	// (the granularity of prefix hashes and of reuse plans).
	ChunkSize = 256

	// MaxPendingStores bounds LookupRequest.pending_store_ids: the engine
	// names at most this many of its stores in flight in a lookup, the blend
	// server rejects a lookup naming more.
	MaxPendingStores = 256
)

// KVNamespace is the model key under which the blend server (and the fleet
// tier) keeps a model's KV chunks: the served name for the built-in model;
// for a model file, the name and the file's identity, so that two files
// with one general.name (two quantizations of a model) never share KV.
func KVNamespace(name, identity string) string {
	if identity == "" {
		return name
	}
	return name + "@" + identity
}

// Positive sets *v to d when *v is zero or negative: the default of a
// Config field whose zero value means "use the default".
func Positive[T ~int | ~int64 | ~float64](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

package blend

import (
	"fmt"
	"github.com/cacheblend/cacheblend/blend/fleet"
	"time"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/events"
	"github.com/cacheblend/cacheblend/blend/fingerprint"
)

// Defaults of a zero Config.
const (
	DefaultChunkSize       = chunkstore.DefaultChunkSize // 256 tokens
	DefaultL1Bytes         = chunkstore.DefaultL1Bytes   // 1 GiB
	DefaultLookupWorkers   = 2
	DefaultLookupQueue     = 256
	DefaultCopyWorkers     = 2
	DefaultEventQueue      = events.DefaultQueueSize // 4096
	DefaultRegisterQueue   = 1024
	DefaultRegistrationTTL = 60 * time.Second
	DefaultAddr            = "127.0.0.1:0"
)

// DefaultLookupStuckAfter is the default of Config.LookupStuckAfter: 10× the
// engine's default lookup timeout (2 s). A lookup running that long has long
// been given up by its caller, so its worker is stuck (e.g. blocked opening
// an L2 file that never answers).
const DefaultLookupStuckAfter = 20 * time.Second

// Limits on what a request may ask for.
const (
	// MaxTokens bounds the tokens of one lookup or store.
	MaxTokens = 1 << 20
	// MaxWorldSize bounds a lookup's world_size.
	MaxWorldSize = 1 << 10
)

// Config holds the optional settings of a Server; the zero value is a 1 GiB
// L1-only store of 256-token chunks, two lookup workers, two copy workers
// and a 4096-event bus, served on a free loopback port. A Config is a plain
// value, read once by New.
type Config struct {
	// Fleet is the Redis fleet tier shared by many nodes (package fleet);
	// off when Fleet.URL is empty.
	Fleet fleet.Config
	// Addr is the gRPC listen address (DefaultAddr, a free loopback port,
	// when empty; see Server.Addr).
	Addr string
	// ChunkSize is the number of tokens per stored chunk (DefaultChunkSize
	// when <= 0, at most chunkstore.MaxChunkTokens).
	ChunkSize int
	// L1Bytes is the byte budget of the memory tier (DefaultL1Bytes when <= 0).
	L1Bytes int64
	// L2Dir is the directory of chunk files; "" means no L2.
	L2Dir string
	// L2Bytes bounds the chunk files' total size; <= 0 is unbounded.
	L2Bytes int64
	// FingerprintWindow is the fingerprint window W in tokens
	// (fingerprint.DefaultWindow, 16, when <= 0).
	FingerprintWindow int
	// LookupWorkers is the number of goroutines running lookups
	// (DefaultLookupWorkers when <= 0).
	LookupWorkers int
	// LookupQueue bounds the lookups waiting for a worker; a Lookup beyond
	// it is answered ResourceExhausted (DefaultLookupQueue when <= 0).
	LookupQueue int
	// CopyWorkers is the number of scatter goroutines, the copy "stream"
	// (DefaultCopyWorkers when <= 0).
	CopyWorkers int
	// EventQueue bounds the event bus; events beyond it are dropped and
	// counted (DefaultEventQueue when <= 0).
	EventQueue int
	// RegisterQueue bounds the fingerprint registrations waiting for the
	// registration goroutine; beyond it a registration is dropped and counted
	// (DefaultRegisterQueue when <= 0).
	RegisterQueue int
	// RegistrationTTL is how long a worker's KV registration lives without
	// being renewed by RegisterKV (workers renew every second); after it the
	// mapping is released (DefaultRegistrationTTL when <= 0).
	RegistrationTTL time.Duration
	// LookupStuckAfter is how long one lookup may run before its worker
	// counts as stuck: the server is then unhealthy (the gRPC health
	// service answers NOT_SERVING, Server.Health returns the reason, the
	// process's /health answers 503) until the lookup returns
	// (DefaultLookupStuckAfter when <= 0).
	LookupStuckAfter time.Duration
}

func (c Config) withDefaults() (Config, error) {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.ChunkSize <= 0 {
		c.ChunkSize = DefaultChunkSize
	}
	if c.ChunkSize > chunkstore.MaxChunkTokens {
		return c, fmt.Errorf("blend: chunk size %d exceeds %d", c.ChunkSize, chunkstore.MaxChunkTokens)
	}
	if c.L1Bytes <= 0 {
		c.L1Bytes = DefaultL1Bytes
	}
	if c.L2Bytes < 0 {
		c.L2Bytes = 0
	}
	if c.FingerprintWindow <= 0 {
		c.FingerprintWindow = fingerprint.DefaultWindow
	}
	if c.LookupWorkers <= 0 {
		c.LookupWorkers = DefaultLookupWorkers
	}
	if c.LookupQueue <= 0 {
		c.LookupQueue = DefaultLookupQueue
	}
	if c.CopyWorkers <= 0 {
		c.CopyWorkers = DefaultCopyWorkers
	}
	if c.EventQueue <= 0 {
		c.EventQueue = DefaultEventQueue
	}
	if c.RegisterQueue <= 0 {
		c.RegisterQueue = DefaultRegisterQueue
	}
	if c.RegistrationTTL <= 0 {
		c.RegistrationTTL = DefaultRegistrationTTL
	}
	if c.LookupStuckAfter <= 0 {
		c.LookupStuckAfter = DefaultLookupStuckAfter
	}
	return c, nil
}

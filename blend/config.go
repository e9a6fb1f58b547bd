package blend

import (
	"fmt"
	"time"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/blend/events"
	"github.com/cacheblend/cacheblend/blend/fingerprint"
	"github.com/cacheblend/cacheblend/blend/fleet"
	"github.com/cacheblend/cacheblend/defaults"
)

// Defaults of a zero Config.
const (
	DefaultChunkSize     = chunkstore.DefaultChunkSize // 256 tokens
	DefaultL1Bytes       = chunkstore.DefaultL1Bytes   // 1 GiB
	DefaultLookupWorkers = 2
	DefaultLookupQueue   = 256
	DefaultCopyWorkers   = 2
	DefaultEventQueue    = events.DefaultQueueSize // 4096
	DefaultRegisterQueue = 1024
	DefaultAddr          = "127.0.0.1:0"
	// DefaultMaxKVRegistrations bounds the KV socket's connections in
	// total (one per worker rank).
	DefaultMaxKVRegistrations = 64
	// DefaultMaxKVRegistrationsPerPeer bounds them per peer process: one
	// rank, plus slack for a close the server has not handled yet.
	DefaultMaxKVRegistrationsPerPeer = 4
	DefaultKVHandshakeTimeout        = 5 * time.Second
)

// DefaultLookupStuckAfter is the default of Config.LookupStuckAfter: 10× the
// engine's default lookup timeout (2 s), long after its caller gave up.
const DefaultLookupStuckAfter = 20 * time.Second

// Limits on what a request may ask for.
const (
	// MaxTokens bounds the tokens of one lookup or store.
	MaxTokens = 1 << 20
	// MaxWorldSize bounds a lookup's world_size (and a rank).
	MaxWorldSize = 1 << 10
	// MaxMatches bounds the matches of one retrieve.
	MaxMatches = 4096
	// MaxWorkerIDLen bounds a worker id, in bytes.
	MaxWorkerIDLen = 256
)

// Config holds the optional settings of a Server; the zero value is a 1 GiB
// L1-only store of 256-token chunks, two lookup workers, two copy workers
// and a 4096-event bus, served on a free loopback port. A Config is a plain
// value, read once by New.
type Config struct {
	// Fleet is the Redis fleet tier shared by many nodes (package fleet);
	// off when Fleet.URL is empty. With a URL, Fleet.Key (the fleet key,
	// the same on every node, at least fleet.MinKeyLen bytes) is required:
	// every value in Redis is signed with it and checked before use.
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
	// LookupStuckAfter is how long one lookup may run before its worker
	// counts as stuck and the server unhealthy (see Server.Health) until it
	// returns (DefaultLookupStuckAfter when <= 0).
	LookupStuckAfter time.Duration
	// FleetStatusWait bounds how long a fleet status query (the engine's,
	// before it answers a document ingest; BlendService.FleetStatus) waits
	// for the documents' fleet writes to be attempted once
	// (DefaultFleetStatusWait, 1 s, when <= 0).
	FleetStatusWait time.Duration
	// KVSocket is the path of the Unix socket on which workers hand over
	// their KV memory (package rpc/kvsock; its directory must be private to
	// this user). Empty: kv.sock in a new private temporary directory,
	// removed at Shutdown (see Server.KVSocket).
	KVSocket string
	// MaxKVRegistrations bounds the KV socket's connections in total,
	// MaxKVRegistrationsPerPeer per peer process; beyond either one is
	// answered RESOURCE_EXHAUSTED (the Default* constants when <= 0).
	MaxKVRegistrations, MaxKVRegistrationsPerPeer int
	// KVHandshakeTimeout bounds the wait for a connection's registration
	// (DefaultKVHandshakeTimeout when <= 0).
	KVHandshakeTimeout time.Duration
}

// withDefaults fills the zero fields of c with their defaults and bounds
// the chunk size.
func (c Config) withDefaults() (Config, error) {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	defaults.Positive(&c.ChunkSize, DefaultChunkSize)
	if c.ChunkSize > chunkstore.MaxChunkTokens {
		return c, fmt.Errorf("blend: chunk size %d exceeds %d", c.ChunkSize, chunkstore.MaxChunkTokens)
	}
	defaults.Positive(&c.L1Bytes, DefaultL1Bytes)
	c.L2Bytes = max(c.L2Bytes, 0)
	defaults.Positive(&c.FingerprintWindow, fingerprint.DefaultWindow)
	defaults.Positive(&c.LookupWorkers, DefaultLookupWorkers)
	defaults.Positive(&c.LookupQueue, DefaultLookupQueue)
	defaults.Positive(&c.CopyWorkers, DefaultCopyWorkers)
	defaults.Positive(&c.EventQueue, DefaultEventQueue)
	defaults.Positive(&c.RegisterQueue, DefaultRegisterQueue)
	defaults.Positive(&c.MaxKVRegistrations, DefaultMaxKVRegistrations)
	defaults.Positive(&c.MaxKVRegistrationsPerPeer, DefaultMaxKVRegistrationsPerPeer)
	defaults.Positive(&c.KVHandshakeTimeout, DefaultKVHandshakeTimeout)
	defaults.Positive(&c.LookupStuckAfter, DefaultLookupStuckAfter)
	defaults.Positive(&c.FleetStatusWait, DefaultFleetStatusWait)
	return c, nil
}

package fingerprint

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"

	"github.com/cacheblend/cacheblend/blend/chunkstore"
	"github.com/cacheblend/cacheblend/reuseplan"
)

// Defaults of a zero Config.
const (
	DefaultWindow        = 16
	DefaultBase          = 0x100000001b3 // the 64-bit FNV prime (odd)
	DefaultStaleStrikes  = 2
	DefaultMaxCandidates = 8
)

// ErrBadSequence reports a Register call whose sequence is malformed.
var ErrBadSequence = errors.New("fingerprint: bad sequence")

// Config holds the optional settings of a Table; the zero value is a window
// of 16 tokens, minimum match 16, the default base, two stale strikes.
type Config struct {
	// Window is W, the number of leading tokens of a chunk that form its
	// fingerprint (DefaultWindow when <= 0). A chunk shorter than W gets no
	// fingerprint: it is never the start of a match, but a match may extend
	// into it.
	Window int
	// MinMatch is the minimum length in tokens of a reported match (Window
	// when smaller than Window: a match always contains a verified window).
	MinMatch int
	// Base is the multiplier of the polynomial rolling hash (mod 2^64); it is
	// forced odd. DefaultBase when zero. Base 1 makes the fingerprint a
	// multiset hash (any permutation of a window collides), which tests use
	// to exercise collision rejection.
	Base uint64
	// StaleStrikes is how many MarkStale calls unregister a chunk
	// (DefaultStaleStrikes when <= 0).
	StaleStrikes int
	// MaxCandidates bounds the stored chunks verified per table hit
	// (DefaultMaxCandidates when <= 0); more chunks sharing a fingerprint
	// are ignored by Match.
	MaxCandidates int
}

// Sequence is a stored sequence (a document or a prompt) to register: its
// chunk keys in order and all its tokens; chunk i covers
// Tokens[i*ChunkSize : min((i+1)*ChunkSize, len(Tokens))].
type Sequence struct {
	Keys      []chunkstore.Key
	Tokens    []int32
	ChunkSize int // chunkstore.DefaultChunkSize when <= 0
}

// Match is a token-exact reused range found in a table: the reuse plan's
// (non-prefix) match, whose Keys are the stored chunks spanning its stored
// range, with the chunk size of the stored sequence it came from and that
// registration's id.
type Match struct {
	reuseplan.Match
	ChunkSize int
	Sequence  uint64 // the registration the match came from
}

// MatchStats describes one Match call.
type MatchStats struct {
	Probes     int // positions whose rolling hash was probed (stride 1)
	TableHits  int // probes that found the hash in the table
	Collisions int // candidates whose window failed token verification
	Short      int // verified candidates rejected as shorter than MinMatch
	Matches    int // matches returned
	HitTokens  int // tokens covered by the matches
}

// Result is the outcome of Match: non-overlapping matches in increasing
// Cur.Start order, and the stats.
type Result struct {
	Matches []Match
	Stats   MatchStats
}

// Stats is a snapshot of the table.
type Stats struct {
	Fingerprints      int   // live fingerprints in the table
	Chunks            int   // registered chunk keys
	Capacity          int   // slots of the open-addressing table
	Registered        int64 // fingerprints ever added
	Unregistered      int64 // chunks unregistered (directly or as stale)
	StaleMarks        int64 // MarkStale calls on registered chunks
	StaleUnregistered int64 // chunks unregistered by their stale strikes
}

type sequence struct {
	id        uint64
	keys      []chunkstore.Key
	tokens    []int32
	chunkSize int
	live      []bool // per chunk; written under the write lock
}

type entry struct {
	seq   *sequence
	chunk int32
	next  int32 // next entry with the same hash, -1 at the end
	key   uint64
}

type chunkRef struct {
	seq *sequence
	idx int
}

type chunkInfo struct {
	refs    []chunkRef
	entry   int32 // fingerprint entry, -1 when none
	strikes int
}

// Table is the fingerprint table of stored chunks: an open-addressing hash
// table from the 64-bit rolling hash of a chunk's first W tokens to the
// chunks that start with them. Register, Unregister and MarkStale may run
// concurrently with Match (a RWMutex; Match holds the read lock for its
// whole scan). All methods are safe for concurrent use.
type Table struct {
	params

	mu      sync.RWMutex
	keys    []uint64 // slot -> hash|1; 0 = empty
	heads   []int32  // slot -> first entry, -1 = tombstone
	mask    uint64
	shift   uint
	filter  []uint64 // bitset over the top fbits of hash*fibMul: a cheap first test
	fshift  uint     // 64 - fbits
	used    int      // non-empty slots (live + tombstones)
	live    int
	entries []entry
	free    []int32
	chunks  map[chunkstore.Key]*chunkInfo
	nextSeq uint64

	registered, unregistered, staleMarks, staleUnreg int64
}

// params are a Table's fixed settings and hash constants.
type params struct {
	window, minMatch, strikes, maxCand int
	base, basePowW1                    uint64 // B and B^(W-1)
	seed, mixMul                       uint64 // token mixing (mixMul 0 only in tests)
}

const (
	fibMul      = 0x9e3779b97f4a7c15
	defaultSeed = 0x2545f4914f6cdd1d
	mixConst    = 0xbf58476d1ce4e5b9
	minCapacity = 1024
	// The filter has 2^filterExtraBits bits per slot (8: a 32 KiB filter for
	// 10,000 chunks, about 4% false positives), at most 2^maxFilterBits bits.
	filterExtraBits = 3
	maxFilterBits   = 22
)

// NewTable returns an empty table for cfg.
func NewTable(cfg Config) *Table {
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.MinMatch < cfg.Window {
		cfg.MinMatch = cfg.Window
	}
	if cfg.Base == 0 {
		cfg.Base = DefaultBase
	}
	cfg.Base |= 1
	if cfg.StaleStrikes <= 0 {
		cfg.StaleStrikes = DefaultStaleStrikes
	}
	if cfg.MaxCandidates <= 0 {
		cfg.MaxCandidates = DefaultMaxCandidates
	}
	t := &Table{
		params: params{window: cfg.Window, minMatch: cfg.MinMatch, strikes: cfg.StaleStrikes, maxCand: cfg.MaxCandidates,
			base: cfg.Base, seed: defaultSeed, mixMul: mixConst},
		chunks: make(map[chunkstore.Key]*chunkInfo),
	}
	t.basePowW1 = 1
	for range cfg.Window - 1 {
		t.basePowW1 *= cfg.Base
	}
	t.rebuild(minCapacity)
	return t
}

// Window is W.
func (t *Table) Window() int { return t.window }

// MinMatch is the effective minimum match length.
func (t *Table) MinMatch() int { return t.minMatch }

func (t *Table) mix(tok int32) uint64 { return (uint64(uint32(tok)) ^ t.seed) * t.mixMul }

// hashWindow is the polynomial hash of w (len W): sum m(w[i]) * B^(W-1-i).
func (t *Table) hashWindow(w []int32) uint64 {
	var h uint64
	for _, tok := range w {
		h = h*t.base + t.mix(tok)
	}
	return h
}

// rebuild re-creates the slot arrays with capacity slots (a power of two),
// reinserting the live entries and dropping tombstones. Caller holds mu.
func (t *Table) rebuild(capacity int) {
	heads := make(map[uint64]int32, t.live)
	if t.keys != nil {
		for i, k := range t.keys {
			if k != 0 && t.heads[i] >= 0 {
				heads[k] = t.heads[i]
			}
		}
	}
	t.keys = make([]uint64, capacity)
	t.heads = make([]int32, capacity)
	t.mask = uint64(capacity - 1)
	slotBits := bits.TrailingZeros(uint(capacity))
	t.shift = uint(64 - slotBits)
	fbits := min(slotBits+filterExtraBits, maxFilterBits)
	t.filter = make([]uint64, (1<<fbits)/64)
	t.fshift = uint(64 - fbits)
	t.used, t.live = 0, 0
	for k, h := range heads {
		i := t.slotFor(k)
		t.keys[i], t.heads[i] = k, h
		t.used++
		t.live++
		t.setFilter(k)
	}
}

// setFilter marks hash key k in the filter. Bits are only cleared by
// rebuild, so the filter may say "maybe" for a removed key, never "no" for a
// present one.
func (t *Table) setFilter(k uint64) {
	f := (k * fibMul) >> t.fshift
	t.filter[f>>6] |= 1 << (f & 63)
}

// slotFor returns the slot holding key k, or the empty slot where it would
// go. Caller holds mu.
func (t *Table) slotFor(k uint64) uint64 {
	i := (k * fibMul) >> t.shift
	for t.keys[i] != 0 && t.keys[i] != k {
		i = (i + 1) & t.mask
	}
	return i
}

// insert adds entry e (already in t.entries) under hash key k. Caller holds
// the write lock.
func (t *Table) insert(k uint64, e int32) {
	if (t.used+1)*2 > len(t.keys) {
		t.rebuild(max(minCapacity, 1<<bits.Len(uint((t.live+1)*3))))
	}
	i := t.slotFor(k)
	t.setFilter(k)
	switch {
	case t.keys[i] == 0:
		t.keys[i], t.heads[i] = k, e
		t.entries[e].next = -1
		t.used++
		t.live++
	case t.heads[i] < 0: // tombstone of the same key
		t.heads[i] = e
		t.entries[e].next = -1
		t.live++
	default:
		t.entries[e].next = t.heads[i]
		t.heads[i] = e
	}
}

// remove unlinks entry e. Caller holds the write lock.
func (t *Table) remove(e int32) {
	k := t.entries[e].key
	i := t.slotFor(k)
	if t.keys[i] != k {
		return
	}
	if t.heads[i] == e {
		t.heads[i] = t.entries[e].next
		if t.heads[i] < 0 {
			t.live--
		}
	} else {
		for p := t.heads[i]; p >= 0; p = t.entries[p].next {
			if t.entries[p].next == e {
				t.entries[p].next = t.entries[e].next
				break
			}
		}
	}
	t.entries[e] = entry{next: -1}
	t.free = append(t.free, e)
}

func (t *Table) newEntry(seq *sequence, chunk int, key uint64) int32 {
	en := entry{seq: seq, chunk: int32(chunk), next: -1, key: key}
	if n := len(t.free); n > 0 {
		e := t.free[n-1]
		t.free = t.free[:n-1]
		t.entries[e] = en
		return e
	}
	t.entries = append(t.entries, en)
	return int32(len(t.entries) - 1)
}

// Register adds a stored sequence: every chunk of at least W tokens whose key
// has no fingerprint yet gets one (the hash of its first W tokens), and every
// chunk becomes available for extending matches. Registering a key again
// resets its stale strikes. The table keeps copies of keys and tokens. It
// returns the number of fingerprints added.
func (t *Table) Register(s Sequence) (int, error) {
	cs := s.ChunkSize
	if cs <= 0 {
		cs = chunkstore.DefaultChunkSize
	}
	if len(s.Tokens) == 0 {
		return 0, fmt.Errorf("%w: no tokens", ErrBadSequence)
	}
	if n := (len(s.Tokens) + cs - 1) / cs; len(s.Keys) != n {
		return 0, fmt.Errorf("%w: %d keys for %d tokens in chunks of %d (want %d)", ErrBadSequence, len(s.Keys), len(s.Tokens), cs, n)
	}
	if len(s.Tokens) > 1<<30 {
		return 0, fmt.Errorf("%w: %d tokens", ErrBadSequence, len(s.Tokens))
	}
	seq := &sequence{
		keys:      append([]chunkstore.Key(nil), s.Keys...),
		tokens:    append([]int32(nil), s.Tokens...),
		chunkSize: cs,
		live:      make([]bool, len(s.Keys)),
	}
	hashes := make([]uint64, len(s.Keys))
	for i := range s.Keys {
		if lo := reuseplan.Chunk(i, cs, len(seq.tokens)).Start; len(seq.tokens)-lo >= t.window {
			hashes[i] = t.hashWindow(seq.tokens[lo:lo+t.window]) | 1
		}
	}
	added := 0
	t.mu.Lock()
	defer t.mu.Unlock()
	t.nextSeq++
	seq.id = t.nextSeq
	for i, k := range seq.keys {
		info := t.chunks[k]
		if info == nil {
			info = &chunkInfo{entry: -1}
			t.chunks[k] = info
		}
		info.refs = append(info.refs, chunkRef{seq, i})
		info.strikes = 0
		seq.live[i] = true
		if info.entry < 0 && hashes[i] != 0 {
			e := t.newEntry(seq, i, hashes[i])
			t.insert(hashes[i], e)
			info.entry = e
			added++
		}
	}
	t.registered += int64(added)
	return added, nil
}

// Unregister removes a chunk: its fingerprint leaves the table and matches
// no longer extend into it. It reports whether the key was registered.
func (t *Table) Unregister(key chunkstore.Key) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.unregister(key)
}

func (t *Table) unregister(key chunkstore.Key) bool {
	info, ok := t.chunks[key]
	if !ok {
		return false
	}
	if info.entry >= 0 {
		t.remove(info.entry)
	}
	for _, r := range info.refs {
		r.seq.live[r.idx] = false
	}
	delete(t.chunks, key)
	t.unregistered++
	return true
}

// MarkStale records that key's KV was not found in storage (a fingerprint
// hit with a storage miss, or an eviction from every tier). After
// StaleStrikes marks the chunk is unregistered; MarkStale then returns true.
func (t *Table) MarkStale(key chunkstore.Key) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	info, ok := t.chunks[key]
	if !ok {
		return false
	}
	t.staleMarks++
	info.strikes++
	if info.strikes < t.strikes {
		return false
	}
	t.unregister(key)
	t.staleUnreg++
	return true
}

// Contains reports whether key is registered.
func (t *Table) Contains(key chunkstore.Key) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	_, ok := t.chunks[key]
	return ok
}

// Stats returns a snapshot of the table.
func (t *Table) Stats() Stats {
	t.mu.RLock()
	defer t.mu.RUnlock()
	n := 0
	for _, info := range t.chunks {
		if info.entry >= 0 {
			n++
		}
	}
	return Stats{
		Fingerprints: n, Chunks: len(t.chunks), Capacity: len(t.keys),
		Registered: t.registered, Unregistered: t.unregistered,
		StaleMarks: t.staleMarks, StaleUnregistered: t.staleUnreg,
	}
}

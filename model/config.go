package model

import (
	"fmt"
	"math"
	"runtime"

	"github.com/cacheblend/cacheblend/defaults"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/rope"
	"github.com/cacheblend/cacheblend/tokenizer"
)

// Default model dimensions. With the SIMD kernels (package simd) a full
// prefill of a 2,000-token prompt stays under one second on a 2-core
// machine (about 0.5 s of CPU, spread over both cores; see the README),
// the CacheBlend speed-up ceiling L/(cl+1+(L-cl-1)*ratio) is 3.90
// at the default check layer and ratio (16/(2+14·0.15)), and Heads and
// KVHeads are even so that tensor parallelism can split them over 2 ranks.
// Heads of 32 fill the kernels' 32-column panels; 2 KV heads keep the KV
// cache at 8 KiB per token.
const (
	DefaultLayers       = 16
	DefaultDim          = 256
	DefaultHeads        = 8
	DefaultKVHeads      = 2
	DefaultFFNDim       = 768
	DefaultVocab        = tokenizer.Vocab // 256 byte ids, BOS and EOS
	DefaultMaxPositions = 8192
	DefaultSeed         = 42
	DefaultCheckLayer   = defaults.CheckLayer
	DefaultRecompRatio  = defaults.RecompRatio
	DefaultRoPETheta    = rope.DefaultTheta // rotary base θ (10000)
)

// Config sizes and seeds a Model. Every zero field means its default (see
// DefaultConfig), so Config{} is a working configuration. A Config is a plain
// value, safe to copy and to use concurrently.
type Config struct {
	Layers       int     // transformer layers; default DefaultLayers (16)
	Dim          int     // model width; default DefaultDim (256)
	Heads        int     // query heads; default DefaultHeads (8); Dim must be a multiple
	KVHeads      int     // key/value heads (grouped-query attention); default DefaultKVHeads (2); divides Heads
	FFNDim       int     // SwiGLU hidden width; default DefaultFFNDim (768)
	Vocab        int     // vocabulary size; default DefaultVocab (258, the byte tokenizer's)
	MaxPositions int     // largest position + 1 the model accepts; default 8192
	RoPETheta    float64 // rotary base; default DefaultRoPETheta (10000)
	Seed         uint64  // weight seed (math/rand/v2 PCG); default DefaultSeed (42)
	CheckLayer   int     // CacheBlend check layer cl; default 1 (zero means default)
	RecompRatio  float64 // CacheBlend recompute ratio; default 0.15 (zero means default)
	Threads      int     // goroutines per kernel call; default runtime.GOMAXPROCS(0)

	// Set by Load from the model file (New: the built-in model's values).
	Arch          string  // architecture; default ArchLlama
	Name          string  // the file's general.name; default BuiltinName
	NormEps       float64 // RMSNorm epsilon; default 1e-5
	RoPEFreqScale float64 // linear RoPE scaling (1/factor); default 1
}

// DefaultConfig returns the default configuration with every field filled
// in.
func DefaultConfig() Config {
	return Config{}.withDefaults()
}

// withDefaults fills zero fields with their defaults.
func (c Config) withDefaults() Config {
	if c.Layers == 0 {
		c.Layers = DefaultLayers
	}
	if c.Dim == 0 {
		c.Dim = DefaultDim
	}
	if c.Heads == 0 {
		c.Heads = DefaultHeads
	}
	if c.KVHeads == 0 {
		c.KVHeads = DefaultKVHeads
	}
	if c.FFNDim == 0 {
		c.FFNDim = DefaultFFNDim
	}
	if c.Vocab == 0 {
		c.Vocab = DefaultVocab
	}
	if c.MaxPositions == 0 {
		c.MaxPositions = DefaultMaxPositions
	}
	if c.RoPETheta == 0 {
		c.RoPETheta = DefaultRoPETheta
	}
	if c.Seed == 0 {
		c.Seed = DefaultSeed
	}
	if c.CheckLayer == 0 {
		c.CheckLayer = DefaultCheckLayer
	}
	if c.RecompRatio == 0 {
		c.RecompRatio = DefaultRecompRatio
	}
	if c.Threads == 0 {
		c.Threads = runtime.GOMAXPROCS(0)
	}
	if c.Arch == "" {
		c.Arch = ArchLlama
	}
	if c.Name == "" {
		c.Name = BuiltinName
	}
	if c.NormEps == 0 {
		c.NormEps = 1e-5
	}
	if c.RoPEFreqScale == 0 {
		c.RoPEFreqScale = 1
	}
	return c
}

// HeadDim is Dim/Heads (after defaults).
func (c Config) HeadDim() int {
	c = c.withDefaults()
	return c.Dim / c.Heads
}

// Validate reports a configuration that cannot build a model (after
// defaults are applied), wrapping ErrBadConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Layers < 0 || c.Dim < 0 || c.Heads < 0 || c.KVHeads < 0 || c.FFNDim < 0 ||
		c.Vocab < 0 || c.MaxPositions < 0 || c.Threads < 0 || c.RoPETheta < 0:
		return fmt.Errorf("%w: negative dimension in %+v", ErrBadConfig, c)
	case c.Dim%c.Heads != 0:
		return fmt.Errorf("%w: Dim %d is not a multiple of Heads %d", ErrBadConfig, c.Dim, c.Heads)
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("%w: Heads %d is not a multiple of KVHeads %d", ErrBadConfig, c.Heads, c.KVHeads)
	case (c.Dim/c.Heads)%2 != 0:
		return fmt.Errorf("%w: head dimension %d is odd", ErrBadConfig, c.Dim/c.Heads)
	case c.CheckLayer < 0 || c.CheckLayer >= c.Layers:
		return fmt.Errorf("%w: CheckLayer %d outside [0, %d)", ErrBadConfig, c.CheckLayer, c.Layers)
	case math.IsNaN(c.RecompRatio) || c.RecompRatio < 0 || c.RecompRatio > 1:
		return fmt.Errorf("%w: RecompRatio %v outside [0, 1]", ErrBadConfig, c.RecompRatio)
	case c.MaxPositions > 1<<24:
		return fmt.Errorf("%w: MaxPositions %d too large", ErrBadConfig, c.MaxPositions)
	}
	return nil
}

// KVLayout is the paged KV-cache layout this configuration needs for a pool
// of numBlocks blocks of blockSize tokens of element type dt.
func (c Config) KVLayout(numBlocks, blockSize int, dt kvcache.DType) kvcache.Layout {
	c = c.withDefaults()
	return kvcache.Layout{
		NumLayers: c.Layers,
		NumBlocks: numBlocks,
		BlockSize: blockSize,
		KVHeads:   c.KVHeads,
		HeadDim:   c.Dim / c.Heads,
		DType:     dt,
	}
}

// SpeedupCeiling is the CacheBlend TTFT speed-up bound
// L/(cl+1+(L-cl-1)*ratio) for this configuration's Layers, CheckLayer and
// RecompRatio.
func (c Config) SpeedupCeiling() float64 {
	c = c.withDefaults()
	return SpeedupCeiling(c.Layers, c.CheckLayer, c.RecompRatio)
}

// SpeedupCeiling is L/(cl+1+(L-cl-1)*ratio), the TTFT speed-up bound of a
// CacheBlend forward over a full prefill when every layer costs the same.
func SpeedupCeiling(layers, checkLayer int, ratio float64) float64 {
	return float64(layers) / (float64(checkLayer+1) + float64(layers-checkLayer-1)*ratio)
}

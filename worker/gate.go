package worker

import (
	"fmt"
	"time"

	"github.com/cacheblend/cacheblend/corpus"
	"github.com/cacheblend/cacheblend/kvcache"
	"github.com/cacheblend/cacheblend/model"
	"github.com/cacheblend/cacheblend/quality"
)

// Blend gate modes (Config.BlendGate).
const (
	// GateAuto checks the model at start and turns blending off when the
	// check fails (the default).
	GateAuto = "auto"
	// GateOn keeps blending on without a check.
	GateOn = "on"
	// GateOff turns blending off without a check.
	GateOff = "off"
)

// DefaultBlendGateKL is the default of Config.BlendGateKL: the mean KL
// (nats) between the next-token distributions of a full prefill and a blend
// above which the gate turns blending off. The built-in model measures
// 0.002–0.007 on the sample corpus at its default ratio (README "CacheBlend
// quality"); a model whose reused KV is useless measures several nats.
const DefaultBlendGateKL = 0.1

// Gate outcomes (cbv1.InfoResponse.blend_gate).
const (
	gatePassed    = "passed"
	gateFailed    = "failed"
	gateForcedOn  = "forced_on"
	gateForcedOff = "forced_off"
)

// gateTokens bounds each sample document of the gate's check.
const gateTokens = 160

// gateResult is the outcome of the blend gate: whether the worker's model
// may blend reused documents, and why not.
type gateResult struct {
	Outcome  string        // passed, failed, forced_on, forced_off
	KL       float64       // mean KL over the cases and positions (0 when not checked)
	Top1     float64       // mean top-1 agreement
	Cases    int           // prompts checked
	Duration time.Duration // time the check took
	Off      string        // why blending is off ("" when on)
}

// runGate runs the blend gate on m (a whole model) as cfg asks: forced
// either way, or CheckBlendGate at cfg.Quality.GateKL. encode tokenizes text
// as the engine would (bos < 0: no BOS).
func runGate(m *model.Model, cfg Config, encode func(string) []int32, bos int32) (gateResult, error) {
	switch cfg.Quality.Gate {
	case GateOn:
		return gateResult{Outcome: gateForcedOn}, nil
	case GateOff:
		return gateResult{Outcome: gateForcedOff, Off: "blending forced off (--blend-gate off)"}, nil
	}
	kvType, err := kvcache.ParseDType(cfg.KVType)
	if err != nil {
		return gateResult{}, err
	}
	return CheckBlendGate(m, encode, bos, cfg.Quality.GateKL, kvType)
}

// GateResult is the outcome of the blend gate's check (CheckBlendGate).
type GateResult = gateResult

// CheckBlendGate is the blend gate's self-check, as a worker runs it at
// start with --blend-gate auto (and cb eval --gate): it blends the sample
// documents into two prompts, compares them with full prefills over four
// teacher-forced positions (quality.Blend, at m's own check layer and
// ratio) on a KV cache of kvType (the worker's) and fails when the mean
// KL is above maxKL. m must be a whole
// model; encode tokenizes text as the engine would, bos is prepended when
// >= 0. It only reads m and may run concurrently with its other calls.
func CheckBlendGate(m *model.Model, encode func(string) []int32, bos int32, maxKL float64, kvType kvcache.DType) (GateResult, error) {
	t0 := time.Now()
	prefix := encode("Answer the question from the documents.\n")
	if bos >= 0 {
		prefix = append([]int32{bos}, prefix...)
	}
	question := encode("\nQuestion: what do these documents describe?\nAnswer:")
	docs := corpus.Documents()
	var r gateResult
	for _, set := range [][]int{{0, 1, 2}, {3, 4, 5}} {
		c := quality.Case{Prefix: prefix, Question: question}
		for _, i := range set {
			d := encode(docs[i%len(docs)].Text)
			c.Docs = append(c.Docs, d[:min(len(d), gateTokens)])
		}
		rep, err := quality.Blend(m, c, quality.Options{Ratio: model.UseConfig, Positions: 4, KVType: kvType})
		if err != nil {
			return r, fmt.Errorf("blend gate: %w", err)
		}
		r.KL += rep.MeanKL
		r.Top1 += rep.Top1
		r.Cases++
	}
	r.KL /= float64(r.Cases)
	r.Top1 /= float64(r.Cases)
	r.Duration = time.Since(t0)
	r.Outcome = gatePassed
	if r.KL > maxKL {
		r.Outcome = gateFailed
		r.Off = fmt.Sprintf("blend gate failed: mean KL %.4g nats from a full prefill on the sample documents, above %.4g (--blend-gate-kl)", r.KL, maxKL)
	}
	return r, nil
}

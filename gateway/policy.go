package gateway

import (
	"math"
	"net/http"
)

// Reasons of a routing decision (Decision.Reason, the route.reason attribute and the reason
// label of cb_gateway_routing_decisions_total).
const (
	// ReasonReuse: the chosen engine is the one expected to reuse the most of the prompt.
	ReasonReuse = "reuse"
	// ReasonSpread: an engine expected to reuse more of the prompt was passed over because
	// of its load.
	ReasonSpread = "spread"
	// ReasonLoad: no engine was expected to reuse anything (or the policy looks at load
	// only); the choice is by load.
	ReasonLoad = "load"
	// ReasonRotation: round-robin.
	ReasonRotation = "rotation"
)

// RouteRequest is what a policy knows of the request to route.
type RouteRequest struct {
	// Operation is "chat", "text_completion", or "documents" for a document ingest.
	Operation string
	// PromptTokens is the number of prompt tokens (for documents: of all documents), at
	// least 1.
	PromptTokens int
}

// Candidate is an engine a policy may choose: healthy, not failed for this request, with a
// free slot. Load and reuse are the gateway's view at the time of the decision.
type Candidate struct {
	// Name is the engine's host:port (route.engine).
	Name string
	// URL is the engine's base URL.
	URL string
	// InFlight is the requests the gateway has in flight on the engine.
	InFlight int
	// Waiting and Running are the engine's own gauges (cb_engine_requests_waiting,
	// cb_engine_requests_running) from its last /metrics.
	Waiting, Running int
	// KVUsed is the fraction of the engine's KV blocks in use (cb_engine_kv_blocks
	// {state="used"} / cb_engine_kv_pool_blocks), 0 when unknown.
	KVUsed float64
	// Load is the load the built-in policies compare: the engine requests the gateway has in
	// flight (a document ingest counts one per document) plus those the engine reported that
	// are not the gateway's (max(0, waiting + running − the gateway's at that scrape)), plus
	// KVUsed.
	Load float64
	// ExpectedHitTokens is how many prompt tokens the engine is expected to reuse, learned
	// from the prompts and documents the gateway routed there.
	ExpectedHitTokens int
	// KVHeld is the share of the engine's KV pool that holds KV: its used and cached blocks
	// (cb_engine_kv_blocks) over cb_engine_kv_pool_blocks at its last /metrics, plus the new
	// prompt tokens the gateway routed there since (at 16 tokens a block). The first
	// tie-breaker between equally loaded engines: new KV goes where it fits.
	KVHeld float64
	// Recent is a decayed count of the requests routed to the engine lately (half-life 10 s),
	// the tie-breaker after KVHeld.
	Recent float64
}

// Decision is a policy's choice.
type Decision struct {
	// Index is the chosen candidate's index.
	Index int
	// Score is the chosen engine's score under the policy (route.score).
	Score float64
	// Reason is ReasonReuse, ReasonSpread, ReasonLoad or ReasonRotation.
	Reason string
	// Header, when set, is added to the forwarded request (an extension point: a
	// disaggregated policy names the decode engine here).
	Header http.Header
}

// Policy chooses an engine for a request among the candidates (never empty). Choose is called
// with the gateway's routing lock held: it must be quick and must not block. Implementations
// must be safe for concurrent use (the built-in ones are). A custom Policy is given in
// Deps.Policy.
type Policy interface {
	// Name is the policy's name (route.policy).
	Name() string
	// Choose returns the decision; seq counts the decisions made so far (for rotations).
	Choose(r *RouteRequest, c []Candidate, seq uint64) Decision
}

// newPolicy returns the built-in policy named name (validated by Config).
func newPolicy(name string, alpha, margin float64) Policy {
	switch name {
	case PolicyLeastLoaded:
		return leastLoaded{}
	case PolicyRoundRobin:
		return roundRobin{}
	}
	return kvAware{alpha: alpha, margin: margin}
}

// better reports whether candidate a wins a tie against b: lower load, then less KV held,
// then fewer recent requests. Equal on all, neither wins (the caller rotates).
func better(a, b *Candidate) (win, tie bool) {
	const eps = 1e-9
	for _, k := range [][2]float64{{a.Load, b.Load}, {a.KVHeld, b.KVHeld}, {a.Recent, b.Recent}} {
		switch {
		case k[0] < k[1]-eps:
			return true, false
		case k[0] > k[1]+eps:
			return false, false
		}
	}
	return false, true
}

// argmin returns the index of the candidate with the lowest key, ties broken by better, then
// by rotation (seq).
func argmin(c []Candidate, seq uint64, key func(*Candidate) float64) int {
	n := len(c)
	start := int(seq % uint64(n))
	best := start
	for k := 1; k < n; k++ {
		i := (start + k) % n
		ki, kb := key(&c[i]), key(&c[best])
		switch {
		case ki < kb-1e-9:
			best = i
		case ki <= kb+1e-9:
			if win, _ := better(&c[i], &c[best]); win {
				best = i
			}
		}
	}
	return best
}

// kvAware scores each engine by the fraction of the prompt it is expected to reuse against
// its load, and spreads when the best engine is loaded beyond the margin:
//
//	score(e) = expected_hit_tokens(e)/prompt_tokens − alpha·load(e)
//
// The highest score wins (ties: lower load, less KV held, fewer recent requests, rotation). When the
// winner's load exceeds the least loaded candidate's by more than margin, the request goes to
// the best-scoring candidate among those within margin of the least load instead.
type kvAware struct{ alpha, margin float64 }

func (kvAware) Name() string { return PolicyKVAware }

func (p kvAware) score(r *RouteRequest, c *Candidate) float64 {
	n := max(r.PromptTokens, 1)
	return float64(min(c.ExpectedHitTokens, n))/float64(n) - p.alpha*c.Load
}

func (p kvAware) Choose(r *RouteRequest, c []Candidate, seq uint64) Decision {
	neg := func(x *Candidate) float64 { return -p.score(r, x) }
	best := argmin(c, seq, neg)
	least := argmin(c, seq, func(x *Candidate) float64 { return x.Load })
	chosen := best
	if c[best].Load-c[least].Load > p.margin {
		// Spread: the best-scoring engine among those not loaded beyond the margin.
		limit := c[least].Load + p.margin
		sub := make([]Candidate, 0, len(c))
		idx := make([]int, 0, len(c))
		for i := range c {
			if c[i].Load <= limit {
				sub = append(sub, c[i])
				idx = append(idx, i)
			}
		}
		chosen = idx[argmin(sub, seq, neg)]
	}
	maxHit := 0
	for i := range c {
		maxHit = max(maxHit, c[i].ExpectedHitTokens)
	}
	reason := ReasonLoad
	switch {
	case 10*c[chosen].ExpectedHitTokens < 9*maxHit: // passed over at least a tenth more reuse
		reason = ReasonSpread
	case maxHit > 0:
		reason = ReasonReuse
	}
	return Decision{Index: chosen, Score: p.score(r, &c[chosen]), Reason: reason}
}

// leastLoaded picks the lowest load (ties: less KV held, fewer recent requests, rotation);
// score −load.
type leastLoaded struct{}

func (leastLoaded) Name() string { return PolicyLeastLoaded }

func (leastLoaded) Choose(_ *RouteRequest, c []Candidate, seq uint64) Decision {
	i := argmin(c, seq, func(x *Candidate) float64 { return x.Load })
	return Decision{Index: i, Score: -c[i].Load, Reason: ReasonLoad}
}

// roundRobin rotates over the candidates; score 0.
type roundRobin struct{}

func (roundRobin) Name() string { return PolicyRoundRobin }

func (roundRobin) Choose(_ *RouteRequest, c []Candidate, seq uint64) Decision {
	return Decision{Index: int(seq % uint64(len(c))), Reason: ReasonRotation}
}

// decay is the factor of Candidate.Recent per second (half-life 10 s).
var decay = math.Pow(0.5, 1.0/10)

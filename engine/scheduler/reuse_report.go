package scheduler

import "github.com/cacheblend/cacheblend/rpc/cbv1"

// reuseLoaded corrects the reuse counts of a request whose whole prompt was
// prefilled in one step with its CacheBlend plan (it: the step's item, the
// first token sampled), with what the worker's forward took as loaded:
// SeqOutput.reused_tokens, the positions it skipped as an exact prefix (the
// engine's cached blocks included) plus the reused positions with loaded KV.
// A plan range the blend server could not serve, or a failed load, was
// computed instead: it is then not counted as reused (the counts are only
// ever lowered). A prompt prefilled in several steps keeps the plan's
// counts.
func (s *Scheduler) reuseLoaded(sq *seq, it item, out *cbv1.SeqOutput) {
	if sq.plan == nil || sq.resumed || len(sq.tokens) != sq.nPrompt || sq.computed-it.n != int(sq.plan.GetPrefixHitTokens()) {
		return
	}
	loaded := int(out.GetReusedTokens())
	sq.h.update(func(r *Result) {
		if loaded >= r.CachedTokens+r.ReusedTokens {
			return
		}
		fromBlend := max(loaded-r.CachedTokens, 0)
		r.ReusedTokens = fromBlend
		r.PrefixReusedTokens = min(r.PrefixReusedTokens, fromBlend)
	})
}

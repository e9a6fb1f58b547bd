// Package quality measures how far a CacheBlend answer drifts from the
// full prefill's: the divergence of the next-token distributions (KL),
// whether the most likely token agrees (top-1), and for how many tokens the
// greedy continuation stays the same. It works on raw logits, as the model
// returns them, so any two forwards over the same vocabulary compare.
//
// The functions are pure and safe for concurrent use.
package quality

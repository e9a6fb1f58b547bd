package rpc

import (
	"fmt"

	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// MatchToProto converts a reuse-plan match to its message.
func MatchToProto(m reuseplan.Match) *cbv1.Match {
	keys := make([][]byte, len(m.Keys))
	for i := range m.Keys {
		keys[i] = m.Keys[i][:]
	}
	return &cbv1.Match{
		StoredSt: int32(m.StoredStart), StoredEd: int32(m.Stored().End),
		CurSt: int32(m.Cur.Start), CurEd: int32(m.Cur.End),
		Prefix: m.Prefix, ChunkKeys: keys, FirstChunkStart: int32(m.FirstChunkStart),
	}
}

// MatchesToProto converts reuse-plan matches to their messages.
func MatchesToProto(ms []reuseplan.Match) []*cbv1.Match {
	out := make([]*cbv1.Match, len(ms))
	for i, m := range ms {
		out[i] = MatchToProto(m)
	}
	return out
}

// MatchFromProto converts a match message. It fails when a key is not
// reuseplan.KeySize bytes or the stored and current ranges differ in length;
// the ranges themselves are checked by reuseplan.Match.Validate.
func MatchFromProto(p *cbv1.Match) (reuseplan.Match, error) {
	m := reuseplan.Match{
		Cur:         reuseplan.Range{Start: int(p.GetCurSt()), End: int(p.GetCurEd())},
		StoredStart: int(p.GetStoredSt()), Prefix: p.GetPrefix(), FirstChunkStart: int(p.GetFirstChunkStart()),
	}
	if se := int(p.GetStoredEd()); se-m.StoredStart != m.Cur.End-m.Cur.Start {
		return m, fmt.Errorf("stored range [%d,%d) does not match current range [%d,%d)", m.StoredStart, se, m.Cur.Start, m.Cur.End)
	}
	m.Keys = make([]reuseplan.Key, len(p.GetChunkKeys()))
	for i, b := range p.GetChunkKeys() {
		k, err := reuseplan.KeyFromBytes(b)
		if err != nil {
			return m, fmt.Errorf("chunk key %d: %w", i, err)
		}
		m.Keys[i] = k
	}
	return m, nil
}

// MatchesFromProto converts match messages; the error names the first bad
// match.
func MatchesFromProto(ps []*cbv1.Match) ([]reuseplan.Match, error) {
	out := make([]reuseplan.Match, len(ps))
	for i, p := range ps {
		m, err := MatchFromProto(p)
		if err != nil {
			return nil, fmt.Errorf("match %d: %w", i, err)
		}
		out[i] = m
	}
	return out, nil
}

// PlanToProto converts a reuse plan to the CBPlan of a step.
func PlanToProto(p reuseplan.Plan) *cbv1.CBPlan {
	return &cbv1.CBPlan{
		PrefixHitTokens: int32(p.Start), Matches: MatchesToProto(p.Matches),
		ChunkSize: int32(p.ChunkSize), RecompRatio: p.RecompRatio,
	}
}

// PlanFromProto converts a step's CBPlan. Its matches are converted, not
// validated: the blend server validates what it is asked to write.
func PlanFromProto(p *cbv1.CBPlan) (reuseplan.Plan, error) {
	ms, err := MatchesFromProto(p.GetMatches())
	if err != nil {
		return reuseplan.Plan{}, err
	}
	return reuseplan.Plan{
		ChunkSize: int(p.GetChunkSize()), RecompRatio: p.GetRecompRatio(),
		Start: int(p.GetPrefixHitTokens()), Matches: ms,
	}, nil
}

// RangesToProto converts token ranges to their messages.
func RangesToProto(rs []reuseplan.Range) []*cbv1.Range {
	out := make([]*cbv1.Range, len(rs))
	for i, r := range rs {
		out[i] = &cbv1.Range{Start: int32(r.Start), End: int32(r.End)}
	}
	return out
}

// RangesFromProto converts range messages.
func RangesFromProto(ps []*cbv1.Range) []reuseplan.Range {
	out := make([]reuseplan.Range, len(ps))
	for i, p := range ps {
		out[i] = reuseplan.Range{Start: int(p.GetStart()), End: int(p.GetEnd())}
	}
	return out
}

// HitsFromProto is the hit statistics of a lookup result. A server that
// does not report its prefix coverage covers at least its usable prefix.
func HitsFromProto(r *cbv1.LookupResult) reuseplan.Hits {
	h := reuseplan.Hits{Requested: int(r.GetRequestedTokens()), Prefix: int(r.GetPrefixHitTokens()), NonPrefix: int(r.GetNonPrefixHitTokens())}
	h.Coverage = max(int(r.GetPrefixCoverageTokens()), h.Prefix)
	return h
}

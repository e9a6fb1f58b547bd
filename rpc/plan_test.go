package rpc

import (
	"fmt"
	"testing"

	"github.com/cacheblend/cacheblend/reuseplan"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

func TestPlanRoundTrip(t *testing.T) {
	var k0, k1 reuseplan.Key
	k0[0], k1[31] = 7, 9
	p := reuseplan.Plan{ChunkSize: 256, RecompRatio: 0.2, Start: 256, Matches: []reuseplan.Match{
		{Cur: reuseplan.Range{End: 256}, Prefix: true, Keys: []reuseplan.Key{k0}},
		{Cur: reuseplan.Range{Start: 300, End: 400}, StoredStart: 10, Keys: []reuseplan.Key{k1}},
	}}
	got, err := PlanFromProto(PlanToProto(p))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(p) {
		t.Fatalf("round trip\n %+v\nwant\n %+v", got, p)
	}
	rs := []reuseplan.Range{{Start: 1, End: 5}, {Start: 9, End: 12}}
	if back := RangesFromProto(RangesToProto(rs)); fmt.Sprint(back) != fmt.Sprint(rs) {
		t.Fatalf("ranges %v", back)
	}
}

func TestMatchFromProtoRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    *cbv1.Match
	}{
		{"short key", &cbv1.Match{CurSt: 0, CurEd: 4, StoredSt: 0, StoredEd: 4, ChunkKeys: [][]byte{{1, 2}}}},
		{"lengths differ", &cbv1.Match{CurSt: 0, CurEd: 4, StoredSt: 0, StoredEd: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := MatchFromProto(tc.m); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestHitsFromProto(t *testing.T) {
	tests := []struct {
		name string
		res  *cbv1.LookupResult
		want reuseplan.Hits
	}{
		{"reported coverage", &cbv1.LookupResult{RequestedTokens: 100, PrefixHitTokens: 16, NonPrefixHitTokens: 30, PrefixCoverageTokens: 32},
			reuseplan.Hits{Requested: 100, Coverage: 32, Prefix: 16, NonPrefix: 30}},
		{"coverage not reported: the usable prefix", &cbv1.LookupResult{RequestedTokens: 100, PrefixHitTokens: 16},
			reuseplan.Hits{Requested: 100, Coverage: 16, Prefix: 16}},
		{"nil result", nil, reuseplan.Hits{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := HitsFromProto(tc.res); got != tc.want {
				t.Fatalf("HitsFromProto = %+v, want %+v", got, tc.want)
			}
		})
	}
}

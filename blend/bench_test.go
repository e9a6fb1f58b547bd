package blend

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// BenchmarkLookup is the unified lookup of a 2,000-token prompt holding a
// stored 300-token document at offset 700 (in process, no gRPC).
func BenchmarkLookup(b *testing.B) {
	e, _, doc := docEnv(b, Config{})
	prompt := promptWith(promptN, 700, doc, 1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		res := e.s.lookup(&cbv1.LookupRequest{RequestId: fmt.Sprint("b", i), Tokens: prompt, WorldSize: 1, Model: testModel}, "", "", time.Now())
		if res.GetNonPrefixHitTokens() != docLen {
			b.Fatalf("lookup %+v", res)
		}
	}
}

// BenchmarkRetrieve scatters the 300 re-RoPE'd tokens of that match into a
// worker's memory (in process, through the copy pool).
func BenchmarkRetrieve(b *testing.B) {
	e, _, doc := docEnv(b, Config{})
	prompt := promptWith(promptN, 700, doc, 1)
	res := e.lookup(&cbv1.LookupRequest{RequestId: "bench", Tokens: prompt, WorldSize: 1, Model: testModel})
	req := &cbv1.RetrieveRequest{RequestId: "bench", WorkerId: "w0", BlockTable: targetTable(promptN / bs), Matches: res.GetMatches()}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		rr, err := e.s.retrieve(ctx, req)
		if err != nil || rr.GetScatteredTokens() != docLen {
			b.Fatalf("retrieve %v %v", rr, err)
		}
	}
}

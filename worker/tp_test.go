package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/cacheblend/cacheblend/component"
	"github.com/cacheblend/cacheblend/contract/spanname"
	"github.com/cacheblend/cacheblend/rankgroup"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/tp"
)

// localPeers runs every step on the other ranks' workers in this process
// (rankgroup.Group does it over sockets between processes).
type localPeers struct {
	peers []*Worker
	fail  error // returned instead of running the step
}

func (p *localPeers) Execute(ctx context.Context, req *cbv1.ExecuteRequest, local rankgroup.Local) (*cbv1.ExecuteResponse, error) {
	if p.fail != nil {
		return nil, p.fail
	}
	errs := make([]error, len(p.peers))
	var wg sync.WaitGroup
	for i, w := range p.peers {
		wg.Go(func() { _, errs[i] = w.Execute(ctx, req) })
	}
	resp, err := local(ctx, req)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return resp, err
}

// startGroup starts world workers as the ranks of one group (goroutines
// over a local all-reduce) and a client of rank 0.
func startGroup(t *testing.T, world int) (*harness, *localPeers) {
	t.Helper()
	rs, err := tp.NewLocalGroup(world, tp.Config{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tpv := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	peers := &localPeers{}
	var rank0 *Worker
	for rank := range world {
		cfg := Config{Model: smallModel, ShmDir: t.TempDir(), NumBlocks: 64, WorkerID: "tp"}
		deps := Deps{Deps: component.Deps{TracerProvider: tpv, Registerer: prometheus.NewRegistry()}, Reducer: rs[rank]}
		if rank == 0 {
			deps.Peers = peers
		}
		w, err := New(cfg, deps)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := w.Shutdown(context.Background()); err != nil {
				t.Error(err)
			}
			if ents, _ := os.ReadDir(cfg.ShmDir); len(ents) != 0 {
				t.Errorf("files left: %v", ents)
			}
		})
		if rank == 0 {
			rank0 = w
		} else {
			peers.peers = append(peers.peers, w)
		}
	}
	conn, err := grpc.NewClient(rank0.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		tpv.Shutdown(context.Background())
	})
	return &harness{w: rank0, client: cbv1.NewWorkerServiceClient(conn), conn: conn, rec: rec, tp: tpv}, peers
}

func TestTensorParallelWorkerMatchesWhole(t *testing.T) {
	cases := []struct {
		name   string
		prompt []int32
		chunk  int // prefill chunk
	}{
		{"one prefill step", prompt(100), 100},
		{"chunked prefill", otherPrompt(100), 32},
		{"chunked prefill, first prompt", prompt(100), 32},
	}
	whole := start(t, Config{})
	group, _ := startGroup(t, 2)
	info, err := group.client.Info(context.Background(), &cbv1.InfoRequest{})
	if err != nil || info.GetWorldSize() != 2 {
		t.Fatalf("Info world_size %d, %v", info.GetWorldSize(), err)
	}
	if l := group.w.kv.Layout(); l.KVHeads != smallModel.KVHeads/2 {
		t.Fatalf("rank 0 KV memory holds %d KV heads, want %d", l.KVHeads, smallModel.KVHeads/2)
	}
	wants := make([][]int32, len(cases))
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := c.prompt
			id := fmt.Sprint("r", i)
			want := generate(t, whole, id, p, c.chunk, 8, blocks(0, 8))
			got := generate(t, group, id, p, c.chunk, 8, blocks(0, 8))
			if !slices.Equal(got, want) {
				t.Fatalf("--tp 2 tokens %v, whole model %v", got, want)
			}
			wants[i] = want
		})
	}
	// The two prompts' tokens differ: the comparison above can fail.
	requireDistinct(t, wants[0], wants[1])
	// Both ranks recorded their spans, with their rank.
	ranks := map[int64]int{}
	for _, s := range group.rec.Ended() {
		if s.Name() != spanname.CBExecute {
			continue
		}
		for _, a := range s.Attributes() {
			if a.Key == "rank" {
				ranks[a.Value.AsInt64()]++
			}
		}
	}
	if ranks[0] == 0 || ranks[0] != ranks[1] {
		t.Fatalf("cb.execute spans per rank %v", ranks)
	}
}

// TestTensorParallelRankRefusesDirectSteps: a rank other than 0 runs steps
// only as rank 0 forwards them; a direct Execute would stall the group.
func TestTensorParallelRankRefusesDirectSteps(t *testing.T) {
	_, peers := startGroup(t, 2)
	conn, err := grpc.NewClient(peers.peers[0].Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = cbv1.NewWorkerServiceClient(conn).Execute(context.Background(), &cbv1.ExecuteRequest{})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("got %v, want FailedPrecondition", err)
	}
}

func TestTensorParallelGroupFailureIsUnavailable(t *testing.T) {
	h, peers := startGroup(t, 2)
	peers.fail = fmt.Errorf("%w: rank 1 exited", rankgroup.ErrGroupFailed)
	_, err := h.client.Execute(context.Background(), &cbv1.ExecuteRequest{Seqs: []*cbv1.SeqStep{{
		RequestId: "x", BlockTable: blocks(0, 1), Tokens: prompt(4), PromptTokens: prompt(4), IsPrefill: true, Sample: true}}})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v, want Unavailable", err)
	}
}

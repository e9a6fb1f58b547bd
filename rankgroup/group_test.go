package rankgroup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/cacheblend/cacheblend/rpc/cbv1"
	"github.com/cacheblend/cacheblend/tp"
)

const childEnv = "CB_RANKGROUP_TEST_CHILD"

// step is what every rank does with a step: all-reduce a vector of its
// rank+1 (so the sum is known) and report every sequence's store done.
func step(r tp.AllReducer) Local {
	return func(_ context.Context, req *cbv1.ExecuteRequest) (*cbv1.ExecuteResponse, error) {
		v := []float32{float32(r.Rank() + 1), 1}
		if err := r.AllReduce(v); err != nil {
			return nil, err
		}
		if want := float32(r.Size() * (r.Size() + 1) / 2); v[0] != want {
			return nil, fmt.Errorf("sum %v, want %v", v[0], want)
		}
		resp := &cbv1.ExecuteResponse{}
		for _, sq := range req.GetSeqs() {
			resp.StoredRequestIds = append(resp.StoredRequestIds, sq.GetRequestId())
		}
		return resp, nil
	}
}

// runChild is a rank process: mode "ok" serves steps; "die" exits when it
// receives its second step (before the all-reduce).
func runChild(mode string) int {
	rank, _ := strconv.Atoi(os.Getenv(RankEnv))
	r, conn, err := OpenRank(rank, tp.Config{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer r.Close()
	steps := 0
	exec := step(r)
	err = Serve(context.Background(), conn, func(ctx context.Context, req *cbv1.ExecuteRequest) (*cbv1.ExecuteResponse, error) {
		steps++
		if mode == "die" && steps == 2 {
			os.Exit(7)
		}
		return exec(ctx, req)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	return 0
}

func newGroup(t *testing.T, world int, mode string) *Group {
	t.Helper()
	g, err := New(Config{World: world, Env: append(os.Environ(), childEnv+"="+mode)},
		func(rank int) []string { return []string{"-test.run=^$"} }, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		g.Shutdown(ctx)
	})
	return g
}

func req(ids ...string) *cbv1.ExecuteRequest {
	r := &cbv1.ExecuteRequest{}
	for _, id := range ids {
		r.Seqs = append(r.Seqs, &cbv1.SeqStep{RequestId: id})
	}
	return r
}

func TestGroupRunsSteps(t *testing.T) {
	cases := []struct {
		name  string
		world int
	}{
		{"two ranks", 2},
		{"three ranks", 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := newGroup(t, c.world, "ok")
			for k, ids := range [][]string{{"a"}, {"b", "c"}, {}} {
				resp, err := g.Execute(context.Background(), req(ids...), step(g.Reducer()))
				if err != nil {
					t.Fatalf("step %d: %v", k, err)
				}
				if got := resp.GetStoredRequestIds(); fmt.Sprint(got) != fmt.Sprint(ids) && len(ids) > 0 {
					t.Fatalf("step %d stored %v, want %v (every rank reported)", k, got, ids)
				}
			}
			if g.Err() != nil {
				t.Fatal(g.Err())
			}
			if err := g.Shutdown(context.Background()); err != nil || g.Crashed() != nil {
				t.Fatalf("shutdown: %v, crashed %v", err, g.Crashed())
			}
		})
	}
}

func TestMergeStoredWaitsForEveryRank(t *testing.T) {
	g := &Group{cfg: Config{World: 2}, stored: map[string]int{}}
	if got := g.mergeStored([]string{"a", "b"}, [][]string{{"b"}}); fmt.Sprint(got) != "[b]" {
		t.Fatalf("first: %v", got)
	}
	if got := g.mergeStored(nil, [][]string{{"a"}}); fmt.Sprint(got) != "[a]" {
		t.Fatalf("second: %v", got)
	}
	if len(g.stored) != 0 {
		t.Fatalf("left %v", g.stored)
	}
}

// TestRankDeathFailsFast: a rank exiting in the middle of a step fails the
// step (ErrGroupFailed, rank 0's all-reduce does not hang) and closes Done.
func TestRankDeathFailsFast(t *testing.T) {
	g := newGroup(t, 2, "die")
	if _, err := g.Execute(context.Background(), req("a"), step(g.Reducer())); err != nil {
		t.Fatalf("first step: %v", err)
	}
	var localErr error
	_, err := g.Execute(context.Background(), req("b"), func(ctx context.Context, r *cbv1.ExecuteRequest) (*cbv1.ExecuteResponse, error) {
		resp, err := step(g.Reducer())(ctx, r)
		localErr = err
		return resp, err
	})
	if !errors.Is(err, ErrGroupFailed) {
		t.Fatalf("second step: %v, want ErrGroupFailed", err)
	}
	if !errors.Is(localErr, tp.ErrPeerDead) {
		t.Fatalf("rank 0's all-reduce: %v, want tp.ErrPeerDead", localErr)
	}
	select {
	case <-g.Done():
	default:
		t.Fatal("Done not closed")
	}
	if _, err := g.Execute(context.Background(), req("c"), step(g.Reducer())); !errors.Is(err, ErrGroupFailed) {
		t.Fatalf("after the failure: %v", err)
	}
	if g.Crashed() == nil {
		t.Fatal("Crashed: nil after a rank died")
	}
}

func TestFrames(t *testing.T) {
	frame := func(n uint32, kind byte, body string) []byte {
		b := []byte{byte(n), byte(n >> 8), byte(n >> 16), byte(n >> 24), kind}
		return append(b, body...)
	}
	cases := []struct {
		name    string
		in      []byte
		want    string
		wantErr error
	}{
		{"execute", frame(4, KindExecute, "abc"), "abc", nil},
		{"empty payload", frame(1, KindResponse, ""), "", nil},
		{"clean EOF", nil, "", io.EOF},
		{"zero length", frame(0, KindExecute, ""), "", ErrBadFrame},
		{"too long", frame(MaxFrame+2, KindExecute, ""), "", ErrBadFrame},
		{"unknown kind", frame(2, 'Z', "a"), "", ErrBadFrame},
		{"truncated payload", frame(10, KindError, "abc"), "", io.ErrUnexpectedEOF},
		{"truncated header", []byte{1, 0}, "", io.ErrUnexpectedEOF},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, body, err := ReadFrame(bytes.NewReader(c.in))
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("got %v, want %v", err, c.wantErr)
				}
				return
			}
			if err != nil || string(body) != c.want {
				t.Fatalf("got %q, %v", body, err)
			}
		})
	}
	var buf bytes.Buffer
	if err := WriteFrame(&buf, KindExecute, []byte("round trip")); err != nil {
		t.Fatal(err)
	}
	if k, b, err := ReadFrame(&buf); err != nil || k != KindExecute || string(b) != "round trip" {
		t.Fatalf("round trip: %c %q %v", k, b, err)
	}
}

func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{4, 0, 0, 0, 'X', 'a', 'b', 'c'})
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{255, 255, 255, 255, 'R'})
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		for {
			kind, body, err := ReadFrame(r)
			if err != nil {
				return
			}
			if len(body) > MaxFrame || (kind != KindExecute && kind != KindResponse && kind != KindError) {
				t.Fatalf("accepted kind %#x with %d bytes", kind, len(body))
			}
		}
	})
}

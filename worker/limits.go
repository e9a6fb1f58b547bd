package worker

import (
	"fmt"

	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

// Limits on one Execute call, reported in Info (max_step_seqs,
// max_step_tokens) so that the engine's scheduler stays within them. A step
// beyond them is refused whole with InvalidArgument before anything is
// sized from it.
const (
	// MaxStepSeqs bounds the sequences of one step.
	MaxStepSeqs = 256
	// MaxStepTokens bounds the tokens computed in one step (prefill chunks
	// plus one per decode).
	MaxStepTokens = 8192
	// MaxFinishedIDs bounds the finished request ids of one step.
	MaxFinishedIDs = 1 << 14
	// maxRequestID bounds a request id's length.
	maxRequestID = 1024
)

// checkStep validates a whole step against the worker's limits before
// anything is sized from it; a failure refuses the whole step.
func (w *Worker) checkStep(req *cbv1.ExecuteRequest) error {
	seqs := req.GetSeqs()
	if len(seqs) > MaxStepSeqs {
		return fmt.Errorf("%d sequences in one step, at most %d", len(seqs), MaxStepSeqs)
	}
	if n := len(req.GetFinishedRequestIds()); n > MaxFinishedIDs {
		return fmt.Errorf("%d finished ids in one step, at most %d", n, MaxFinishedIDs)
	}
	tokens := 0
	seen := make(map[string]bool, len(seqs))
	for i, sq := range seqs {
		id := sq.GetRequestId()
		switch {
		case id == "":
			return fmt.Errorf("seq %d without request_id", i)
		case len(id) > maxRequestID:
			return fmt.Errorf("seq %d: request_id of %d bytes", i, len(id))
		case seen[id]:
			return fmt.Errorf("seq %d: request %s twice in one step", i, id)
		}
		seen[id] = true
		tokens += len(sq.GetTokens())
		if tokens > MaxStepTokens {
			return fmt.Errorf("more than %d tokens in one step", MaxStepTokens)
		}
	}
	return nil
}

// checkSeq validates one sequence of a step against the model and the KV
// pool before it is computed; a failure fails that sequence alone.
func (w *Worker) checkSeq(sq *cbv1.SeqStep) error {
	mc := w.model.Config()
	maxPos, vocab := mc.MaxPositions, int32(mc.Vocab)
	toks, start := sq.GetTokens(), int(sq.GetStartPos())
	if start < 0 || start+len(toks) > maxPos {
		return fmt.Errorf("positions [%d, %d) outside the model's [0, %d)", start, start+len(toks), maxPos)
	}
	if n := len(sq.GetPromptTokens()); n > maxPos {
		return fmt.Errorf("prompt of %d tokens, the model has %d positions", n, maxPos)
	}
	if d := sq.GetRngDraws(); d > uint32(maxPos) {
		return fmt.Errorf("rng_draws %d beyond the model's %d positions", d, maxPos)
	}
	if s := sq.GetHandoffSecret(); len(s) > 0 && (len(s) != SecretBytes || !sq.GetSample()) {
		return fmt.Errorf("handoff_secret of %d bytes on a step that samples: %v (want %d bytes on a sampling step)", len(s), sq.GetSample(), SecretBytes)
	}
	if len(sq.GetHandoffSecret()) > 0 && w.group.world > 1 {
		return fmt.Errorf("prefill/decode hand-over is not supported by a tensor-parallel worker (world size %d)", w.group.world)
	}
	bt := sq.GetBlockTable()
	if len(bt) > w.cfg.NumBlocks {
		return fmt.Errorf("block table of %d blocks, the pool has %d", len(bt), w.cfg.NumBlocks)
	}
	for j, b := range bt {
		if b < 0 || int(b) >= w.cfg.NumBlocks {
			return fmt.Errorf("block_table[%d] = %d outside the pool of %d", j, b, w.cfg.NumBlocks)
		}
	}
	if need := start + len(toks); len(bt)*w.cfg.BlockSize < need {
		return fmt.Errorf("block table holds %d positions, the step writes up to %d", len(bt)*w.cfg.BlockSize, need)
	}
	for _, list := range [][]int32{toks, sq.GetPromptTokens()} {
		for _, t := range list {
			if t < 0 || t >= vocab {
				return fmt.Errorf("token %d outside the vocabulary of %d", t, vocab)
			}
		}
	}
	return nil
}

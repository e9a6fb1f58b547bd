package engine

import (
	"bytes"
	"sync"
)

// textStream detokenizes a request's output incrementally. Tokens are pushed
// one at a time (from the scheduler's step loop); text is decoded at stable
// boundaries only (never inside an incomplete character), so the text is a
// function of the token sequence alone and a streamed response concatenates
// to exactly the non-streamed one. Stop sequences end the text before their
// first occurrence; while streaming, a suffix that could begin a stop
// sequence is held back. Safe for concurrent use.
type textStream struct {
	tok   Tokenizer
	stops []string

	mu        sync.Mutex
	toks      []int32
	decodedTo int    // tokens turned into text
	text      []byte // decoded text (cut at a stop sequence once stopped)
	emitted   int    // bytes of text handed out by take
	stopped   bool
	final     bool
}

func newTextStream(tok Tokenizer, stops []string) *textStream {
	return &textStream{tok: tok, stops: stops}
}

// push adds one token and reports whether a stop sequence matched.
func (s *textStream) push(t int32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped || s.final {
		return s.stopped
	}
	s.toks = append(s.toks, t)
	stable := len(s.toks) - s.tok.Incomplete(s.toks)
	if stable <= s.decodedTo {
		return false
	}
	old := len(s.text)
	s.text = append(s.text, s.tok.Decode(s.toks[s.decodedTo:stable])...)
	s.decodedTo = stable
	return s.findStop(old)
}

// findStop cuts the text at the first stop sequence that ends after byte
// old, if any.
func (s *textStream) findStop(old int) bool {
	if len(s.stops) == 0 {
		return false
	}
	cut := -1
	for _, st := range s.stops {
		from := max(0, old-len(st)+1)
		if i := bytes.Index(s.text[from:], []byte(st)); i >= 0 && (cut < 0 || from+i < cut) {
			cut = from + i
		}
	}
	if cut < 0 {
		return false
	}
	s.text = s.text[:cut]
	s.stopped = true
	return true
}

// holdback is the length of the longest suffix of the text that is a proper
// prefix of a stop sequence.
func (s *textStream) holdback() int {
	best := 0
	for _, st := range s.stops {
		for k := min(len(st)-1, len(s.text)); k > best; k-- {
			if bytes.HasSuffix(s.text, []byte(st[:k])) {
				best = k
				break
			}
		}
	}
	return best
}

// take returns the text not handed out yet that can no longer change.
func (s *textStream) take() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	avail := len(s.text)
	if !s.stopped && !s.final {
		avail -= s.holdback()
	}
	if avail <= s.emitted {
		return ""
	}
	out := string(s.text[s.emitted:avail])
	s.emitted = avail
	return out
}

// finish decodes what is left (an incomplete trailing character included)
// and returns the text not handed out yet. Later pushes are ignored.
func (s *textStream) finish() string {
	s.mu.Lock()
	if !s.final && !s.stopped && s.decodedTo < len(s.toks) {
		old := len(s.text)
		s.text = append(s.text, s.tok.Decode(s.toks[s.decodedTo:])...)
		s.decodedTo = len(s.toks)
		s.findStop(old)
	}
	s.final = true
	s.mu.Unlock()
	return s.take()
}

// all returns the whole text (call after finish).
func (s *textStream) all() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.text)
}

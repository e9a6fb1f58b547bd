package apiclient

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// maxLine bounds one SSE line (1 MiB).
const maxLine = 1 << 20

// StreamResult is what a chat-completion event stream carried.
type StreamResult struct {
	// ID is the first non-empty chunk id.
	ID string
	// ContentChunks counts the non-empty content deltas; Deltas holds them, in order.
	ContentChunks int
	Deltas        []string
	// Usage is true when a usage chunk was read; PromptTokens and CompletionTokens are its
	// counts (the last one's, if several).
	Usage                          bool
	PromptTokens, CompletionTokens int
	// CacheBlend is the usage chunk's "cacheblend" extension (how the
	// prompt was served); nil when it had none.
	CacheBlend *UsageCacheBlend
}

// UsageCacheBlend is the "cacheblend" usage extension of cacheblend's
// engine: the prompt's tokens reused as an exact prefix, reused from
// chunks at other positions, and computed, and whether the worker took the
// request for its online quality check.
type UsageCacheBlend struct {
	PrefixHitTokens    int  `json:"prefix_hit_tokens"`
	NonPrefixHitTokens int  `json:"non_prefix_hit_tokens"`
	RecomputedTokens   int  `json:"recomputed_tokens"`
	QualitySampled     bool `json:"quality_sampled"`
}

// ReadStream reads an OpenAI chat-completion event stream (server-sent events) from r up to
// data: [DONE], calling onContent (which may be nil) once, at the first non-empty content
// delta. Lines other than "data:" ones (comments, event:, id:, retry:, blank) are skipped;
// the space after "data:" is optional. It returns an *Error (Status 0) of KindStream for an
// error event, KindBadStream for an event that is not JSON, negative usage or a line over
// 1 MiB, and KindTruncated for a stream that ends before [DONE]; a read error is returned
// wrapped. The result holds what was read before any error. Safe for concurrent use on
// different readers.
func ReadStream(r io.Reader, onContent func()) (StreamResult, error) {
	var res StreamResult
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	seen := false
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue // comments, event:, id:, retry: and blank lines
		}
		data = bytes.TrimPrefix(data, []byte(" "))
		if string(data) == "[DONE]" {
			return res, nil
		}
		var chunk struct {
			ID      string `json:"id"`
			Choices []struct {
				Delta struct {
					Content *string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens     int              `json:"prompt_tokens"`
				CompletionTokens int              `json:"completion_tokens"`
				CacheBlend       *UsageCacheBlend `json:"cacheblend"`
			} `json:"usage"`
			Error *struct {
				Message string `json:"message"`
				Type    string `json:"type"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &chunk); err != nil {
			return res, streamError(KindBadStream, fmt.Sprintf("bad event %.80q: %v", data, err))
		}
		if chunk.Error != nil {
			return res, streamError(KindStream, fmt.Sprintf("error event: %s (%s)", chunk.Error.Message, chunk.Error.Type))
		}
		if res.ID == "" {
			res.ID = chunk.ID
		}
		for _, ch := range chunk.Choices {
			if ch.Delta.Content == nil || *ch.Delta.Content == "" {
				continue
			}
			res.ContentChunks++
			res.Deltas = append(res.Deltas, *ch.Delta.Content)
			if !seen {
				seen = true
				if onContent != nil {
					onContent()
				}
			}
		}
		if u := chunk.Usage; u != nil {
			if cb := u.CacheBlend; u.PromptTokens < 0 || u.CompletionTokens < 0 ||
				cb != nil && (cb.PrefixHitTokens < 0 || cb.NonPrefixHitTokens < 0 || cb.RecomputedTokens < 0) {
				return res, streamError(KindBadStream, fmt.Sprintf("negative usage %.200s", data))
			}
			res.Usage, res.PromptTokens, res.CompletionTokens, res.CacheBlend = true, u.PromptTokens, u.CompletionTokens, u.CacheBlend
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return res, streamError(KindBadStream, "an event line over 1 MiB")
		}
		return res, fmt.Errorf("read stream: %w", err)
	}
	return res, streamError(KindTruncated, "the stream ended before data: [DONE]")
}

func streamError(kind, msg string) *Error { return &Error{Kind: kind, Err: errors.New(msg)} }

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
	// ContentChunks counts the non-empty content deltas.
	ContentChunks int
	// Usage is true when a usage chunk was read; PromptTokens and CompletionTokens are its
	// counts (the last one's, if several).
	Usage                          bool
	PromptTokens, CompletionTokens int
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
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
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
			if !seen {
				seen = true
				if onContent != nil {
					onContent()
				}
			}
		}
		if u := chunk.Usage; u != nil {
			if u.PromptTokens < 0 || u.CompletionTokens < 0 {
				return res, streamError(KindBadStream, fmt.Sprintf("negative usage %+v", *u))
			}
			res.Usage, res.PromptTokens, res.CompletionTokens = true, u.PromptTokens, u.CompletionTokens
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

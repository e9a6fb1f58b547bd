package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// maxSSELine bounds one line of an engine's event stream (1 MiB).
const maxSSELine = 1 << 20

// errLineTooLong reports an event-stream line over maxSSELine.
var errLineTooLong = errors.New("gateway: event stream line over 1 MiB")

// sseEvent is what the gateway needs to know of one server-sent event of an engine's
// stream: the event's raw bytes are passed through unchanged.
type sseEvent struct {
	// Raw is the event as received: its lines, each with "\n", and the blank line ending it.
	Raw []byte
	// Done is the "data: [DONE]" event.
	Done bool
	// Content is true when a choice carries non-empty text (chat delta.content, completion
	// text): the response has begun.
	Content bool
	// Finish is true when a choice carries a finish_reason.
	Finish bool
	// Usage is true when the event carries usage; CompletionTokens is its count.
	Usage            bool
	CompletionTokens int
	// Error is true for an error event; Code is its code ("" when none).
	Error bool
	Code  string
}

// sseReader splits an engine's event stream into events.
type sseReader struct {
	br *bufio.Reader
}

func newSSEReader(r io.Reader) *sseReader { return &sseReader{br: bufio.NewReaderSize(r, 32<<10)} }

// next returns the next event. An event is the lines up to a blank line; a stream that ends
// after data lines without the blank line yields them as a last event, then io.EOF. A line
// over maxSSELine is errLineTooLong.
func (s *sseReader) next() (sseEvent, error) {
	var raw, data []byte
	hasData := false
	for {
		line, err := s.line()
		if len(line) > 0 {
			raw = append(raw, line...)
			raw = append(raw, '\n')
			if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
				d = bytes.TrimPrefix(d, []byte(" "))
				if hasData {
					data = append(data, '\n')
				}
				data, hasData = append(data, d...), true
			}
		} else if err == nil && len(raw) > 0 {
			raw = append(raw, '\n')
			return classifyEvent(raw, data, hasData), nil
		}
		if err != nil {
			if len(raw) > 0 && errors.Is(err, io.EOF) {
				return classifyEvent(raw, data, hasData), nil
			}
			return sseEvent{}, err
		}
	}
}

// line reads one line without its line ending; io.EOF after the last.
func (s *sseReader) line() ([]byte, error) {
	var out []byte
	for {
		chunk, err := s.br.ReadSlice('\n')
		if len(out)+len(chunk) > maxSSELine {
			return nil, errLineTooLong
		}
		out = append(out, chunk...)
		switch {
		case err == nil:
			return bytes.TrimRight(out, "\r\n"), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(out) > 0:
			return bytes.TrimRight(out, "\r\n"), nil
		default:
			return nil, err
		}
	}
}

// classifyEvent reads an event's data: [DONE], or a chat/completion chunk (content, finish
// reason, usage) or an error object. Data that is not JSON is passed through as an event that
// is none of these.
func classifyEvent(raw, data []byte, hasData bool) sseEvent {
	ev := sseEvent{Raw: raw}
	if !hasData {
		return ev
	}
	if string(bytes.TrimSpace(data)) == "[DONE]" {
		ev.Done = true
		return ev
	}
	var chunk struct {
		Choices []struct {
			Delta *struct {
				Content *string `json:"content"`
			} `json:"delta"`
			Text         *string         `json:"text"`
			FinishReason json.RawMessage `json:"finish_reason"`
		} `json:"choices"`
		Usage *struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
		Error *struct {
			Code json.RawMessage `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &chunk) != nil {
		return ev
	}
	for _, c := range chunk.Choices {
		if c.Delta != nil && c.Delta.Content != nil && *c.Delta.Content != "" || c.Text != nil && *c.Text != "" {
			ev.Content = true
		}
		if len(c.FinishReason) > 0 && string(c.FinishReason) != "null" {
			ev.Finish = true
		}
	}
	if chunk.Usage != nil && chunk.Usage.CompletionTokens >= 0 {
		ev.Usage, ev.CompletionTokens = true, chunk.Usage.CompletionTokens
	}
	if chunk.Error != nil {
		ev.Error = true
		var code string
		if json.Unmarshal(chunk.Error.Code, &code) == nil {
			ev.Code = code
		}
	}
	return ev
}

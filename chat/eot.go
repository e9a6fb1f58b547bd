package chat

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// ErrNoEndOfTurn: EndOfTurn found no marker after the assistant's reply.
var ErrNoEndOfTurn = errors.New("chat: no end-of-turn marker found")

// eotProbeReply is the assistant reply EndOfTurn looks for in the rendered probe.
const eotProbeReply = "Q7xZ probe reply"

// specialToken matches special-token text at the start of a string: <|eot_id|>, <|im_end|>,
// <|end|>, </s>, <end_of_turn>, <｜end▁of▁sentence｜>, ...
var specialToken = regexp.MustCompile(`^<[^<>\s]{1,64}>`)

// EndOfTurn guesses the text that ends an assistant turn in this template, for use as a stop
// string: the engine adds the matching token as a stop token.
//
// Method: render user, assistant (a unique reply), user without the generation prompt, take the
// text that follows the reply, and return what it starts with: the EOS text (o.EOS) when it starts
// with that (Mistral's "</s>"), else the leading special-token-shaped text <...>
// ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", ...). Leading spaces and newlines are
// skipped. ErrNoEndOfTurn when nothing of that shape follows the reply (for example a template
// that ends an assistant turn with plain text, or one that drops the reply).
func (t *Template) EndOfTurn(o Options) (string, error) {
	o.AddGenerationPrompt = false
	msgs := []Message{
		{Role: "user", Content: "Q7xZ probe question"},
		{Role: "assistant", Content: eotProbeReply},
		{Role: "user", Content: "Q7xZ probe follow-up"},
	}
	out, err := t.Render(msgs, o)
	if err != nil {
		return "", fmt.Errorf("chat: end of turn: %w", err)
	}
	i := strings.Index(out, eotProbeReply)
	if i < 0 {
		return "", fmt.Errorf("%w: the rendered probe does not contain the assistant reply", ErrNoEndOfTurn)
	}
	after := strings.TrimLeft(out[i+len(eotProbeReply):], " \t\r\n")
	if o.EOS != "" && strings.HasPrefix(after, o.EOS) {
		return o.EOS, nil
	}
	if m := specialToken.FindString(after); m != "" {
		return m, nil
	}
	return "", fmt.Errorf("%w: the reply is followed by %q", ErrNoEndOfTurn, firstRunes(after, 24))
}

// EndOfTurn parses src and calls (*Template).EndOfTurn.
func EndOfTurn(src string, o Options) (string, error) {
	t, err := Parse(src)
	if err != nil {
		return "", err
	}
	return t.EndOfTurn(o)
}

func firstRunes(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}

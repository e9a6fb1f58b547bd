package api

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
)

// GenAI operation names (gen_ai.operation.name).
const (
	OperationChat           = "chat"
	OperationTextCompletion = "text_completion"
)

// Finish reasons.
const (
	FinishStop   = "stop"   // EOS sampled or a stop sequence matched
	FinishLength = "length" // max_tokens or the context length reached
)

// Usage is the token accounting of a response.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// PromptTokensDetails says how many prompt tokens were cached (OpenAI's
	// usage.prompt_tokens_details); set on generations, absent on documents.
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
	// CacheBlend splits the cached tokens by how they were reused (the
	// "cacheblend" usage extension); set on generations.
	CacheBlend *UsageCacheBlend `json:"cacheblend,omitempty"`
}

// PromptTokensDetails is OpenAI's usage.prompt_tokens_details.
type PromptTokensDetails struct {
	// CachedTokens counts the prompt tokens whose KV was reused instead of
	// computed: the engine's prefix cache plus what the CacheBlend plan
	// loaded (PrefixHitTokens + NonPrefixHitTokens).
	CachedTokens int `json:"cached_tokens"`
}

// UsageCacheBlend is the "cacheblend" usage extension: how the prompt's
// tokens were served. PrefixHitTokens + NonPrefixHitTokens +
// RecomputedTokens == PromptTokens.
type UsageCacheBlend struct {
	// PrefixHitTokens were reused as an exact prefix: the engine's prefix
	// cache and the blend server's prefix leg (not computed at all).
	PrefixHitTokens int `json:"prefix_hit_tokens"`
	// NonPrefixHitTokens were loaded from stored chunks at other positions
	// (CacheBlend reuse, K re-rotated); the selective recompute refreshes a
	// fraction of them (cb.check's imp_count on the worker's spans).
	NonPrefixHitTokens int `json:"non_prefix_hit_tokens"`
	// RecomputedTokens had no reusable KV and were computed in full.
	RecomputedTokens int `json:"recomputed_tokens"`
	// QualitySampled is true when the worker took this request for its
	// online quality check (cb worker --quality-sample-rate, or the
	// request's "quality_check"): a cb.quality trace linked to the
	// request's cb.model_forward will report how far the reused KV moved
	// its answer from a full prefill's. Omitted when false.
	QualitySampled bool `json:"quality_sampled,omitempty"`
}

// ChatMessageOut is the assistant message of a chat completion choice.
type ChatMessageOut struct {
	Role    string `json:"role"`
	Content string `json:"content"`
	// Refusal is always null: the engine never refuses.
	Refusal *string `json:"refusal"`
}

// ChatChoice is one choice of a chat completion.
type ChatChoice struct {
	Index        int            `json:"index"`
	Message      ChatMessageOut `json:"message"`
	Logprobs     *struct{}      `json:"logprobs"`
	FinishReason string         `json:"finish_reason"`
}

// Response is the body of a generation: a chat completion (object
// "chat.completion"), a streamed chat chunk ("chat.completion.chunk") or a
// text completion and each of its chunks ("text_completion"). Choices are
// C; Usage U is a Usage (always written) or a *Usage (omitted when nil).
type Response[C, U any] struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	// SystemFingerprint names the backend that produced the response (the
	// model's identity and the engine's build; see Fingerprint): with the
	// same seed and fingerprint a request replays.
	SystemFingerprint string `json:"system_fingerprint,omitempty"`
	// Seed is the sampling seed the request ran with (an extension): the
	// client's, or the one the engine drew, in [0, 2^53) so that a
	// JavaScript number holds it exactly. Sending it back as "seed" replays
	// the request. On every body and stream chunk of a generation.
	Seed    *int64 `json:"seed,omitempty"`
	Choices []C    `json:"choices"`
	Usage   U      `json:"usage,omitempty"`
}

// MaxGeneratedSeed bounds the seeds the engine draws: [0, 2^53), the
// integers a JavaScript number (a float64) holds exactly.
const MaxGeneratedSeed = 1 << 53

// ChatCompletion is the body of a non-streamed chat completion.
type ChatCompletion = Response[ChatChoice, Usage]

// ChatDelta is the incremental message of a chat chunk.
type ChatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// ChatChunkChoice is one choice of a chat chunk; FinishReason is null until
// the last content chunk.
type ChatChunkChoice struct {
	Index        int       `json:"index"`
	Delta        ChatDelta `json:"delta"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

// ChatChunk is one server-sent event of a streamed chat completion. The
// usage-only chunk (stream_options.include_usage) has no choices.
type ChatChunk = Response[ChatChunkChoice, *Usage]

// CompletionChoice is one choice of a text completion (or of a chunk; then
// FinishReason is null until the last).
type CompletionChoice struct {
	Index        int       `json:"index"`
	Text         string    `json:"text"`
	Logprobs     *struct{} `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
}

// Completion is the body of a text completion and of each of its streamed
// chunks.
type Completion = Response[CompletionChoice, *Usage]

// Model is one entry of GET /v1/models.
type Model struct {
	ID          string `json:"id"`
	Object      string `json:"object"` // "model"
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	MaxModelLen int    `json:"max_model_len,omitempty"`
}

// ModelList is the body of GET /v1/models.
type ModelList struct {
	Object string  `json:"object"` // "list"
	Data   []Model `json:"data"`
}

// DocumentResult is one ingested document of POST /v1/documents.
type DocumentResult struct {
	Object string `json:"object"` // "document"
	ID     string `json:"id"`
	Index  int    `json:"index"`
	Tokens int    `json:"tokens"`
	// Status is "stored" once the worker reported the store done.
	Status string `json:"status"`
}

// DocumentList is the body of a POST /v1/documents response.
type DocumentList struct {
	Object string           `json:"object"` // "list"
	Model  string           `json:"model"`
	Data   []DocumentResult `json:"data"`
	Usage  Usage            `json:"usage"`
}

// Fingerprint returns a system_fingerprint for the backend described by
// parts (the model's name and identity, its shape, the build): "fp_" and
// the first 10 hex digits of a SHA-256 over them. The same parts give the
// same fingerprint, in every process and across restarts.
func Fingerprint(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		_, _ = io.WriteString(h, p)
		_, _ = h.Write([]byte{0})
	}
	return "fp_" + hex.EncodeToString(h.Sum(nil))[:10]
}

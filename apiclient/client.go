package apiclient

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// healthPoll is the interval between GET /health attempts of WaitHealthy.
const healthPoll = 200 * time.Millisecond

// Config holds the optional settings of a Client. The zero value is valid.
type Config struct {
	// APIKey is sent as "Authorization: Bearer <APIKey>" on every request to the engine
	// when set; default "" sends none.
	APIKey string
	// HTTPClient sends every request; default http.DefaultClient. Its Timeout, if any,
	// bounds whole streams, so it must not be shorter than a completion.
	HTTPClient *http.Client
}

// Document is one document to store for reuse: an ID and its text.
type Document struct {
	// ID names the document (POST /v1/documents "id").
	ID string
	// Text is the document's text.
	Text string
}

// Client speaks the engine's OpenAI-compatible API at one base URL. It holds no state
// between calls and is safe for concurrent use.
type Client struct {
	base   string
	apiKey string
	http   *http.Client
}

// New returns a client of the engine at baseURL (e.g. http://127.0.0.1:8000; a trailing
// slash is dropped). The URL is not checked here: a malformed one makes every call fail
// with the HTTP client's error.
func New(baseURL string, cfg Config) *Client {
	hc := cfg.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Client{base: strings.TrimRight(baseURL, "/"), apiKey: cfg.APIKey, http: hc}
}

// NewTraceparent returns a fresh, sampled W3C traceparent ("00-<trace id>-<span id>-01")
// with random, never all-zero ids, and its trace id. Safe for concurrent use.
func NewTraceparent() (traceparent, traceID string) {
	var b [24]byte
	_, _ = rand.Read(b[:])
	b[0] |= 1  // never all-zero
	b[16] |= 1 // never all-zero
	tid := hex.EncodeToString(b[:16])
	return "00-" + tid + "-" + hex.EncodeToString(b[16:]) + "-01", tid
}

// do sends one request; body, when not nil, is sent as JSON. The API key is sent when auth.
func (c *Client) do(ctx context.Context, method, url string, body any, hdr http.Header, auth bool) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if auth && c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	return c.http.Do(req)
}

// WaitHealthy polls GET /health every 200 ms until it answers 200, timeout elapses (an
// error saying the engine is not healthy, wrapping the last failure) or ctx ends (an error
// wrapping ctx's error). The first attempt is made at once.
func (c *Client) WaitHealthy(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := c.do(ctx, http.MethodGet, c.base+"/health", nil, nil, true)
		if err == nil {
			drainClose(resp.Body)
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("wait for engine health: %w", ctx.Err())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("engine not healthy after %s: %w", timeout, err)
		}
		t := time.NewTimer(healthPoll)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// Ingest stores docs for reuse with one POST /v1/documents. A non-200 answer is an error
// wrapping an *HTTPError.
func (c *Client) Ingest(ctx context.Context, docs []Document) error {
	type doc struct {
		ID   string `json:"id"`
		Text string `json:"text"`
	}
	body := struct {
		Documents []doc `json:"documents"`
	}{Documents: make([]doc, len(docs))}
	for i, d := range docs {
		body.Documents[i] = doc{ID: d.ID, Text: d.Text}
	}
	resp, err := c.do(ctx, http.MethodPost, c.base+"/v1/documents", body, nil, true)
	if err != nil {
		return fmt.Errorf("ingest documents: %w", err)
	}
	defer drainClose(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("ingest documents: %w", httpError(resp))
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return fmt.Errorf("ingest documents: %w", err)
	}
	return nil
}

// Metrics GETs a Prometheus text exposition from url (the base URL+"/metrics" when url is
// empty) and returns its body, which the caller must close. The API key is sent only when
// url is the engine's own base URL+"/metrics", never to another endpoint. A non-200
// answer is an *HTTPError.
func (c *Client) Metrics(ctx context.Context, url string) (io.ReadCloser, error) {
	if url == "" {
		url = c.base + "/metrics"
	}
	hdr := http.Header{"Accept": {"text/plain;version=0.0.4"}}
	resp, err := c.do(ctx, http.MethodGet, url, nil, hdr, url == c.base+"/metrics")
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer drainClose(resp.Body)
		return nil, httpError(resp)
	}
	return resp.Body, nil
}

// maxDrain is the most drainClose reads of what is left of a response body.
const maxDrain = 64 << 10

// drainClose reads what is left of body (at most maxDrain bytes: the end of a
// chunked stream after data: [DONE], the rest of an error body) and closes
// it, so that the transport can reuse the connection: a body closed before
// its end costs the server a new connection for the next request.
func drainClose(body io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(body, maxDrain))
	body.Close()
}

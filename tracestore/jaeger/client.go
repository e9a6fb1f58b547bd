package jaeger

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// DefaultMaxResponseBytes caps the size of a response body read by [Client].
const DefaultMaxResponseBytes = 256 << 20

// ErrNotFound is returned by [Client.Trace] when the server does not know the trace.
var ErrNotFound = errors.New("jaeger: trace not found")

// Client reads a Jaeger-compatible query API. The zero value is not usable; build one with
// [NewClient]. Safe for concurrent use.
type Client struct {
	base    *url.URL
	hc      *http.Client
	maxBody int64
}

// ClientConfig holds optional settings of a [Client].
type ClientConfig struct {
	// HTTPClient sends the requests; nil means http.DefaultClient. Set its Timeout, or pass
	// contexts with deadlines.
	HTTPClient *http.Client
	// MaxResponseBytes caps a response body; 0 means [DefaultMaxResponseBytes].
	MaxResponseBytes int64
}

// NewClient returns a client for the query API at baseURL (e.g. "http://127.0.0.1:16686";
// a path prefix such as "/jaeger" is kept).
func NewClient(baseURL string, cfg ClientConfig) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("jaeger: parse base URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("jaeger: base URL %q must be http(s)://host[:port][/prefix]", baseURL)
	}
	c := &Client{base: u, hc: cfg.HTTPClient, maxBody: cfg.MaxResponseBytes}
	if c.hc == nil {
		c.hc = http.DefaultClient
	}
	if c.maxBody <= 0 {
		c.maxBody = DefaultMaxResponseBytes
	}
	return c, nil
}

// Services returns the service names the server knows.
func (c *Client) Services(ctx context.Context) ([]string, error) {
	var out []string
	_, err := c.Get(ctx, "/api/services", nil, &out)
	return out, err
}

// Operations returns the operation (span) names recorded by a service.
func (c *Client) Operations(ctx context.Context, service string) ([]string, error) {
	var out []string
	_, err := c.Get(ctx, "/api/services/"+url.PathEscape(service)+"/operations", nil, &out)
	return out, err
}

// FindTraces searches traces.
func (c *Client) FindTraces(ctx context.Context, q Query) ([]Trace, error) {
	var out []Trace
	_, err := c.Get(ctx, "/api/traces", q.Values(), &out)
	return out, err
}

// Trace fetches one trace by id; [ErrNotFound] when the server does not have it.
func (c *Client) Trace(ctx context.Context, traceID string) (Trace, error) {
	if !IsTraceID(traceID) {
		return Trace{}, fmt.Errorf("jaeger: trace id %q is not hex", traceID)
	}
	var out []Trace
	status, err := c.Get(ctx, "/api/traces/"+traceID, nil, &out)
	if status == http.StatusNotFound || err == nil && len(out) == 0 {
		return Trace{}, fmt.Errorf("%w: %s", ErrNotFound, traceID)
	}
	if err != nil {
		return Trace{}, err
	}
	return out[0], nil
}

// Get fetches any path of the API (escaped, starting with "/") into data (the envelope's
// data field) and returns the HTTP status; for extensions such as the collector's
// /api/requests.
func (c *Client) Get(ctx context.Context, path string, params url.Values, data any) (int, error) {
	target := c.base.String() + path // path is already escaped
	if len(params) > 0 {
		target += "?" + params.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return 0, fmt.Errorf("jaeger: build request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("jaeger: GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, c.maxBody+1))
	if err != nil {
		return resp.StatusCode, fmt.Errorf("jaeger: read %s: %w", path, err)
	}
	if int64(len(body)) > c.maxBody {
		return resp.StatusCode, fmt.Errorf("jaeger: %s: response larger than %d bytes", path, c.maxBody)
	}
	env := Response[json.RawMessage]{}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&env); err != nil {
		if resp.StatusCode != http.StatusOK {
			return resp.StatusCode, fmt.Errorf("jaeger: GET %s: %s: %s", path, resp.Status, snippet(body))
		}
		return resp.StatusCode, fmt.Errorf("jaeger: decode %s: %w", path, err)
	}
	if len(env.Errors) > 0 {
		return resp.StatusCode, fmt.Errorf("jaeger: GET %s: %w", path, env.Errors[0])
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, fmt.Errorf("jaeger: GET %s: %s", path, resp.Status)
	}
	if len(env.Data) == 0 || string(env.Data) == "null" {
		return resp.StatusCode, nil
	}
	if err := decodeNumbers(env.Data, data); err != nil {
		return resp.StatusCode, fmt.Errorf("jaeger: decode %s data: %w", path, err)
	}
	return resp.StatusCode, nil
}

func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// DecodeTraces decodes a saved query response ({"data": [traces…]}), a JSON array of
// traces, or a single trace object, as written by the Jaeger UI's "download JSON".
// Tag values that are numbers are kept as json.Number.
func DecodeTraces(data []byte) ([]Trace, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, fmt.Errorf("jaeger: decode traces: empty input")
	}
	if data[0] != '[' { // an envelope or a single trace
		var probe map[string]json.RawMessage
		if err := decodeNumbers(data, &probe); err != nil {
			return nil, fmt.Errorf("jaeger: decode traces: %w", err)
		}
		if raw, ok := probe["data"]; ok {
			data = raw
		} else if _, ok := probe["spans"]; ok {
			var t Trace
			if err := decodeNumbers(data, &t); err != nil {
				return nil, fmt.Errorf("jaeger: decode trace: %w", err)
			}
			return []Trace{t}, nil
		} else {
			return nil, fmt.Errorf("jaeger: decode traces: neither {\"data\": […]} nor a trace object")
		}
	}
	var out []Trace
	if err := decodeNumbers(data, &out); err != nil {
		return nil, fmt.Errorf("jaeger: decode traces: %w", err)
	}
	return out, nil
}

// decodeNumbers decodes JSON data into v, keeping numbers as json.Number.
func decodeNumbers(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	return d.Decode(v)
}

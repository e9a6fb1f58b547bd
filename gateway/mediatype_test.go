package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/cacheblend/cacheblend/engine/api"
)

// TestNonJSONBodyRefused: the gateway refuses (415) a body that is not
// declared application/json, before routing it to an engine.
func TestNonJSONBodyRefused(t *testing.T) {
	a := newFakeEngine(t)
	tg := startGateway(t, Config{}, a)
	for _, tc := range []struct {
		name, contentType string
		status            int
	}{
		{"json", "application/json", http.StatusOK},
		{"text/plain", "text/plain;charset=UTF-8", http.StatusUnsupportedMediaType},
		{"form", "application/x-www-form-urlencoded", http.StatusUnsupportedMediaType},
		{"none", "", http.StatusUnsupportedMediaType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, tg.url+api.RouteChat, strings.NewReader(chatBody("x", false)))
			if tc.contentType != "" {
				req.Header.Set("Content-Type", tc.contentType)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if tc.status == http.StatusUnsupportedMediaType && !strings.Contains(string(b), `"code":"unsupported_media_type"`) {
				t.Fatalf("body %s", b)
			}
		})
	}
}

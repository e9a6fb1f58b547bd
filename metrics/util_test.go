package metrics

import (
	"net/http"
	"net/http/httptest"
	"strconv"
)

func strconvFormat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func strconvItoa(i int) string { return strconv.Itoa(i) }

func httptestRecorder(h http.Handler, accept string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	h.ServeHTTP(rec, req)
	return rec
}

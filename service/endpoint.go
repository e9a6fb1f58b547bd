package service

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/cacheblend/cacheblend/telemetry/provider"
)

// NormalizeEndpoint turns a user-given OTLP traces endpoint into a full URL:
// host:port gets http://, and for the HTTP protocols a URL without a path gets
// /v1/traces. For grpc the path is irrelevant and left alone.
func NormalizeEndpoint(ep, protocol string) (string, error) {
	if ep == "" {
		return "", nil
	}
	if !strings.Contains(ep, "://") {
		ep = "http://" + ep
	}
	u, err := url.Parse(ep)
	if err != nil {
		return "", fmt.Errorf("bad endpoint %q: %w", ep, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("bad endpoint %q: scheme must be http or https", ep)
	}
	if u.Host == "" {
		return "", fmt.Errorf("bad endpoint %q: no host", ep)
	}
	if protocol != provider.ProtocolGRPC && (u.Path == "" || u.Path == "/") {
		u.Path = "/v1/traces"
	}
	return u.String(), nil
}

package api

// Route templates of the OpenAI-compatible API (the http_route label), served by the engine
// and the gateway alike (package httpfront).
const (
	RouteChat        = "/v1/chat/completions"
	RouteCompletions = "/v1/completions"
	RouteModels      = "/v1/models"
	RouteModel       = "/v1/models/{model}"
	RouteDocuments   = "/v1/documents"
	RouteHealth      = "/health"
	RouteMetrics     = "/metrics"
	// RouteUnmatched labels requests to unknown paths.
	RouteUnmatched = "unmatched"
)

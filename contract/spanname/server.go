package spanname

// Server returns the name of the engine's SERVER span, the root of a request's trace, for a
// GenAI operation (gen_ai.operation.name: "chat" or "text_completion") and model
// (gen_ai.request.model): "{operation} {model}" as the OpenTelemetry GenAI semantic
// conventions name it, e.g. "chat m1"; the contract (contract/spans.yaml) gives the name as
// that template with a name_pattern. When the model is not known (a request that fails
// before its body is read) the name is the operation alone.
func Server(operation, model string) string {
	if model == "" {
		return operation
	}
	return operation + " " + model
}

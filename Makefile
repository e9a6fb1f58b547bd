# The one test command: `make test` installs what the tests need and runs them all.
GO ?= go

.PHONY: test deps unit lint fuzz bench generate

test: deps lint unit

deps:
	bash scripts/deps.sh

lint:
	@out="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

unit:
	$(GO) test -race -count=1 -timeout 20m ./...
	# The comparisons with llama.cpp and the heavy MLP-halves cases (numerical;
	# built without -race, see model/llamacpp_test.go and model/mlpsplit_test.go).
	$(GO) test -count=1 -timeout 20m -run 'TestAgainstLlamaCpp|TestMLPHalves' ./model

# Fuzz the parsers of outside input, FUZZTIME each (CI: 30s).
FUZZTIME ?= 30s
FUZZ_TARGETS = ./reuseplan:FuzzValidateSegments ./blend/fleet:FuzzDecodeSequence ./telemetry:FuzzParseTraceparent ./engine/api:FuzzDecode ./tracestore:FuzzOTLPReceiver ./blend/chunkstore:FuzzDecodeChunk ./engine/api:FuzzParseHandoff ./engine/api:FuzzParseDecodeEngine ./engine/api:FuzzParseKVReport ./worker:FuzzCheckPull ./gateway:FuzzParseEngineGauges ./gateway:FuzzSSE ./rankgroup:FuzzReadFrame ./blend:FuzzDecodeSequenceFile ./gguf:FuzzParse ./quant:FuzzDequantize ./chat:FuzzParse ./chat:FuzzRender ./vocab:FuzzTokenize ./vocab:FuzzSpecFromGGUF ./apiclient:FuzzReadStream

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; fn=$${t##*:}; echo "fuzz $$pkg $$fn for $(FUZZTIME)"; \
	  GO=$(GO) bash scripts/fuzz.sh $$pkg $$fn $(FUZZTIME); \
	done

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# Regenerate the gRPC code (needs protoc) and the span-name constants of contract/spanname.
generate:
	$(GO) generate ./rpc/... ./contract/...

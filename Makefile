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

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

generate:
	$(GO) generate ./rpc/...

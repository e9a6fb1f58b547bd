// Command genspans generates package contract/spanname from the span contract: one Go
// constant per span name, with a doc comment from the contract. `go generate
// ./contract/...` (part of `make generate`) runs it as
//
//	go run ../cmd/genspans -spans ../spans.yaml -o spanname_gen.go
//
// in contract/spanname. It validates the contract first and writes nothing when it is
// invalid.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/cacheblend/cacheblend/contract"
	"github.com/cacheblend/cacheblend/contract/internal/spangen"
)

func main() {
	spans := flag.String("spans", "spans.yaml", "the span contract to read")
	out := flag.String("o", "spanname_gen.go", "the Go file to write")
	flag.Parse()
	if err := run(*spans, *out); err != nil {
		fmt.Fprintln(os.Stderr, "genspans:", err)
		os.Exit(1)
	}
}

func run(spansPath, outPath string) error {
	data, err := os.ReadFile(spansPath)
	if err != nil {
		return err
	}
	set, err := contract.ParseSpans(data)
	if err != nil {
		return err
	}
	src, err := spangen.Generate(set)
	if err != nil {
		return err
	}
	return os.WriteFile(outPath, src, 0o644)
}

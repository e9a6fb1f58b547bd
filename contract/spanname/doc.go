// Package spanname holds the span names of the span contract (contract/spans.yaml) as Go
// constants, so that code starting, finding or checking a span does not spell its name.
//
// The constants are generated from the contract by contract/cmd/genspans (`make generate`,
// or `go generate ./contract/...`) into spanname_gen.go, which is committed; the package's
// test fails when that file no longer matches the contract, and when a non-test Go file of
// the module spells a span name as a string literal instead of using its constant. Each constant's doc comment
// gives the span's service, kind, phase, parent and when it is present, from the contract.
//
// The engine's SERVER span has no constant: its name varies with the request
// ("{operation} {model}", e.g. "chat m1"); [Server] builds it.
//
// The package imports nothing, so that any package, libraries included, can use it cheaply.
package spanname

//go:generate go run ../cmd/genspans -spans ../spans.yaml -o spanname_gen.go

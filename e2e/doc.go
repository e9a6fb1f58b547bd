// Package e2e holds the end-to-end tests of cacheblend: they build the cb
// binary, run cb blend, cb worker and cb engine as separate OS processes on
// loopback ports (with the embedded trace collector in the test process, or
// a real backend), send requests through the OpenAI API and check what the
// three processes recorded: one trace per request across the processes,
// complete per contract/spans.yaml.
package e2e

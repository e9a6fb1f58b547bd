// Command cb runs the cacheblend stack: each process on its own (cb engine,
// cb worker, cb blend, cb traces) or all of them together (cb up, cb demo),
// plus the tools around it (cb check, cb load, cb eval, cb bench, cb certs,
// cb slo-rules). It holds wiring
// only: every behaviour lives in the packages it imports.
package main

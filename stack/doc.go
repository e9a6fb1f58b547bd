// Package stack supervises the processes of a cacheblend stack on one host:
// it starts cb blend, cb worker and cb engine as separate OS processes (the
// trace must cross real process boundaries), waits until each announces
// itself ready, prefixes and streams their logs, restarts one that dies with
// exponential backoff while the others keep serving, writes an endpoints
// file, and stops them all on Shutdown. Unless told to stay plaintext it
// makes every gRPC hop mutual TLS: a throw-away CA and one certificate per
// process, generated at start and removed at Shutdown (see Up). cb up and
// cb demo are built on it.
package stack

// Package stack supervises the processes of a cacheblend stack on one host:
// it starts cb blend, cb worker and cb engine as separate OS processes (the
// trace must cross real process boundaries), waits until each announces
// itself ready, prefixes and streams their logs, restarts one that dies with
// exponential backoff while the others keep serving, writes an endpoints
// file, and stops them all on Shutdown. cb up and cb demo are built on it.
package stack

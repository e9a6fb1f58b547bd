// Package rankgroup runs a tensor-parallel worker as a group of rank
// processes on one host (cb worker --tp N, docs/design.md §11).
//
// Rank 0 is the process the engine talks to. Its Group starts ranks
// 1..N-1 as child processes of the same executable and hands each two
// inherited descriptors, never a path: the all-reduce segment (a memfd,
// package tp) as descriptor 3 and its end of a socketpair as descriptor 4,
// on which rank 0 forwards every Execute step (Group.Execute) and the rank
// answers (Follower.Serve). The socketpair is the peers' authentication:
// nothing listens, only the parent holds the other end.
//
// Frames on the socket are a 4-byte little-endian length, a kind byte and
// a protobuf payload; ReadFrame bounds the length (MaxFrame) before it
// allocates.
//
// A rank that dies fails the group at once: the watcher that reaps it marks
// the segment (every rank's all-reduce returns tp.ErrPeerDead), closes the
// step sockets (a pending Execute returns ErrGroupFailed, which the worker
// answers with Unavailable, a 503 at the engine) and closes Done, on which
// cb worker exits so that its supervisor (cb up) restarts the whole group.
// Children get SIGKILL when rank 0 dies (Pdeathsig) and exit when their step
// socket closes.
package rankgroup

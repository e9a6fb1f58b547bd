// Package mtls is the transport security of the inter-process RPCs: mutual
// TLS between cb engine, cb worker and cb blend, with each peer identified
// by its role.
//
// Every process holds one certificate signed by the stack's CA. The
// certificate names the process's [Role] (cb-engine, cb-worker, cb-blend) in
// a URI subject alternative name, spiffe://cacheblend/<role> ([Role.URI]),
// and the hosts it serves on in DNS/IP SANs. Three checks protect a port:
//
//  1. The handshake (TLS 1.3 only): a server requires a client certificate
//     and verifies it against the CA ([tls.RequireAndVerifyClientCert]); a
//     client verifies the server's certificate against the CA and its host
//     name, then checks that it names the role it meant to call (the engine
//     dialling the worker accepts only cb-worker). A caller without a
//     certificate, with one from another CA, or speaking plaintext never
//     gets to send a request.
//  2. Authorization, in a gRPC interceptor ([UnaryServerInterceptor],
//     [StreamServerInterceptor]) on every method of the server: the role of
//     the caller's verified certificate must be one of the server's allowed
//     roles ([WorkerCallers]: the engine; [BlendCallers]: the engine and the
//     worker), per service where a [Policy] says so: the worker serves
//     [WorkerPolicy] ([Identity.ServerOptionsFor]), under which its
//     WorkerService (steps, PullKV) admits only the engine and its
//     KVTransferService (ReadKV, the KV of a prefill/decode hand-over) only
//     other workers ([KVTransferCallers]). Otherwise the call ends with
//     codes.PermissionDenied
//     (codes.Unauthenticated when the connection carries no verified
//     certificate at all).
//  3. At start-up [Load] refuses a certificate that does not chain to the
//     CA, has expired, or names another role than the process's own, so a
//     misconfigured process fails at once instead of at its first call.
//
// [NewCA], [CA.Issue] and [WriteDir] generate the throw-away CA and
// certificates of cb up (ECDSA P-256, short validity, no CA key on disk) and
// of cb certs. [WriteCA], [LoadCA] and [CA.WriteHost] keep an operator's CA
// on disk (its key in [CAKeyFile]) and issue one host's certificates from
// it without touching the others' (cb certs init, cb certs issue);
// [ParseRole] reads a role by its name or short name. A process started without certificate files serves and
// calls in plaintext; cmd/cb then logs that its port is unauthenticated.
package mtls

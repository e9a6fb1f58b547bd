// Package metrics exposes cacheblend's instruments on Prometheus client_golang, built only
// from the instrument contract (package contract, instruments.yaml).
//
// Two layers:
//
//   - [Registry] turns contract instruments into client_golang collectors on a caller-supplied
//     prometheus.Registerer and enforces the label policy: values of labels with an allowed
//     list must be listed; capped labels keep at most 64 distinct values per label key and
//     registry (configurable) and record the rest, and values that are not valid UTF-8, as
//     "_other"; a wrong number of label values is refused. Counters refuse negative, NaN and
//     infinite increments, and [Counter.SetTotal] mirrors an external running total, refusing
//     a lower one. Histograms refuse negative and non-finite observations.
//   - Typed facades, one per process role: [EngineMetrics] (GenAI request latencies, HTTP,
//     scheduler gauges, KV hand-overs), [WorkerMetrics] (with KV transfer), [BlendMetrics] (every lmcache_blend_*
//     instrument), [ProcessMetrics] (build info, trace exporter totals) and [GatewayMetrics]
//     (cb gateway: the GenAI request histograms as seen at the gateway, routing, failovers,
//     queue, per-engine health and load). Each registers exactly the contract instruments it
//     owns.
//
// Errors are returned only where series are resolved: the Registry's instrument getters, the
// Series methods and the facade constructors. The constructors resolve every series whose
// label values are fixed by the contract (phase, direction, op, tier, reason, state, leg...),
// so a contract mismatch is a startup error returned by NewEngineMetrics & co. The record methods
// return nothing: fixed labels our code picks are typed constants ([ForwardPhase],
// [KVDirection], [BlendOp], [Tier], [HandoffDirection], [HandoffState]) so a wrong value does
// not compile (another value, made by converting an integer, is refused with a *LabelError
// whose Value reads e.g. "ForwardPhase(9)"); user-fed labels (model, route) go through the
// capped lookup, which cannot fail. What is still wrong at record time
// (a forged enum value, an operation or error type outside the contract, a negative count, a
// counter total going down...) is refused whole: nothing is recorded, [Registry.RecordStats]
// counts it and the [WithOnRefused] handler, if any, receives the reason. Nothing panics on
// bad input.
//
// [Handler] serves a gatherer through promhttp with OpenMetrics negotiation (exemplars are only
// visible in OpenMetrics) and a hook that refreshes gauges before each scrape.
//
// Hot path: resolved series are cached per raw label values in a copy-on-write trie read with
// one atomic load, so observing into an existing series by label values performs no
// allocation and no lock; [Histogram.Series] (and Counter/Gauge Series) return handles that
// skip the lookup entirely. EngineMetrics caches the five series of an (operation, model)
// pair so RecordRequest does a single lookup. Latency histograms marked `exemplars: true` in
// the contract attach {trace_id, span_id} when the context carries a sampled span context.
//
// There are no package-level metrics: everything is registered on the Registerer passed in.
// All exported types are safe for concurrent use.
package metrics

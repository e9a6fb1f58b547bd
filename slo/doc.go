// Package slo turns the service-level objectives of contract/slo.yaml into Prometheus
// recording and alerting rules: multi-window, multi-burn-rate alerts as in the SRE workbook
// (chapter 5, "Alerting on SLOs").
//
// For every objective the generated rule group records:
//
//   - slo:error_budget:ratio{slo="<name>"}: the constant 1 − target, for dashboards
//     (burn rate = error ratio / budget).
//   - slo:sli_error:ratio_rate<w>{slo="<name>"} for every window w used by a burn-rate alert
//     (5m, 30m, 1h, 2h, 6h, 1d, 3d with the contract's alerts): the fraction of bad events
//     over w. For a latency objective, bad = 1 − bucket{le=threshold} / count, summed over
//     every series matching the objective's selector; for an availability objective, bad =
//     count{selector, bad} / count{selector}, both from the histogram's _count.
//
// and one alert per severity (CacheblendSLOBurnRatePage, CacheblendSLOBurnRateTicket, with
// labels slo and severity) that fires when, for any of that severity's window pairs, the error
// ratio is above factor × (1 − target) over both the long and the short window. Thresholds are
// printed rounded to 12 significant digits, so 14.4 × (1 − 0.95) is written 0.72.
//
// [Generate] is deterministic: the same contract always yields the same bytes. The committed
// file deploy/prometheus/slo-rules.yml is its output (cb slo-rules --out ...), and the package
// tests fail when the two differ.
//
// Everything in this package is a pure function of its arguments and safe for concurrent use.
package slo

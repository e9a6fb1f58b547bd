package gateway

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Engine gauges the gateway reads from each engine's /metrics (contract/instruments.yaml).
const (
	gaugeWaiting = "cb_engine_requests_waiting"
	gaugeRunning = "cb_engine_requests_running"
	gaugeKV      = "cb_engine_kv_blocks"
	gaugeKVPool  = "cb_engine_kv_pool_blocks"
)

// Bounds of reading an engine's /metrics: the body (maxMetricsBytes), one line
// (maxMetricsLine; longer lines are skipped) and the lines of the load gauges kept for the
// parser (maxGaugeLines: an engine writes 6 samples and their comments), so that a hostile
// engine cannot make the gateway hold more than a few KiB per health check.
const (
	maxMetricsBytes = 4 << 20
	maxMetricsLine  = 64 << 10
	maxGaugeLines   = 64
)

// engineGauges are the engine's load gauges; Has is false until they were read.
type engineGauges struct {
	Has                      bool
	Waiting, Running         int
	KVFree, KVUsed, KVCached int
	KVPool                   int
}

// errBadMetrics reports an exposition the gateway could not use.
var errBadMetrics = errors.New("gateway: engine /metrics: no load gauges")

// parseEngineGauges reads the engine's load gauges from a Prometheus text exposition (at most
// maxMetricsBytes; lines longer than maxMetricsLine are skipped). The lines of the four gauge
// families (samples, HELP and TYPE) are kept, at most maxGaugeLines, and parsed with expfmt;
// the rest is not looked at. Values must be finite, non-negative and below 2^31 (a KV gauge
// outside is ignored). It returns errBadMetrics when the kept lines do not parse or waiting or
// running is missing.
func parseEngineGauges(r io.Reader) (engineGauges, error) {
	var kept bytes.Buffer
	br := bufio.NewReaderSize(io.LimitReader(r, maxMetricsBytes), 4096)
	for n := 0; ; {
		line, err := readLine(br, maxMetricsLine)
		if gaugeLine(line) {
			if n++; n > maxGaugeLines {
				return engineGauges{}, fmt.Errorf("%w: over %d lines of load gauges", errBadMetrics, maxGaugeLines)
			}
			kept.Write(line)
			kept.WriteByte('\n')
		}
		if err != nil {
			break
		}
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(&kept)
	if err != nil {
		return engineGauges{}, fmt.Errorf("%w: %w", errBadMetrics, err)
	}
	var g engineGauges
	var hasWaiting, hasRunning bool
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			v, ok := gaugeValue(m)
			if !ok {
				continue
			}
			switch name {
			case gaugeWaiting:
				g.Waiting, hasWaiting = v, true
			case gaugeRunning:
				g.Running, hasRunning = v, true
			case gaugeKVPool:
				g.KVPool = v
			case gaugeKV:
				for _, l := range m.GetLabel() {
					switch {
					case l.GetName() != "state":
					case l.GetValue() == "free":
						g.KVFree = v
					case l.GetValue() == "used":
						g.KVUsed = v
					case l.GetValue() == "cached":
						g.KVCached = v
					}
				}
			}
		}
	}
	if !hasWaiting || !hasRunning {
		return engineGauges{}, errBadMetrics
	}
	g.Has = true
	return g, nil
}

// gaugeLine reports whether line is a sample, HELP or TYPE line of one of the four gauges.
func gaugeLine(line []byte) bool {
	for _, prefix := range [][]byte{[]byte("# HELP "), []byte("# TYPE ")} {
		if rest, ok := bytes.CutPrefix(line, prefix); ok {
			line = rest
			break
		}
	}
	for _, name := range []string{gaugeWaiting, gaugeRunning, gaugeKV, gaugeKVPool} {
		if rest, ok := bytes.CutPrefix(line, []byte(name)); ok && len(rest) > 0 && (rest[0] == ' ' || rest[0] == '\t' || rest[0] == '{') {
			return true
		}
	}
	return false
}

// gaugeValue returns a sample's value (gauge or untyped) as a count: finite, non-negative and
// below 2^31.
func gaugeValue(m *dto.Metric) (int, bool) {
	var v float64
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetUntyped() != nil:
		v = m.GetUntyped().GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(v) || v < 0 || v >= 1<<31 {
		return 0, false
	}
	return int(v), true
}

// readLine returns the next line without its newline; a line longer than limit is returned
// empty (skipped) after it was consumed. err is io.EOF (or the read error) after the last line.
func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	var out []byte
	long := false
	for {
		chunk, err := br.ReadSlice('\n')
		if !long {
			if len(out)+len(chunk) > limit {
				long, out = true, nil
			} else {
				out = append(out, chunk...)
			}
		}
		switch {
		case err == nil:
			return bytes.TrimRight(out, "\r\n"), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return bytes.TrimRight(out, "\r\n"), err
		}
	}
}

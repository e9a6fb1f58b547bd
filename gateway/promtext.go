package gateway

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math"
	"strconv"
)

// Engine gauges the gateway reads from each engine's /metrics (contract/instruments.yaml).
const (
	gaugeWaiting = "cb_engine_requests_waiting"
	gaugeRunning = "cb_engine_requests_running"
	gaugeKV      = "cb_engine_kv_blocks"
	gaugeKVPool  = "cb_engine_kv_pool_blocks"
)

// maxMetricsBytes bounds an engine's /metrics body the gateway reads; maxMetricsLine one line.
const (
	maxMetricsBytes = 4 << 20
	maxMetricsLine  = 64 << 10
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
// maxMetricsBytes; lines longer than maxMetricsLine are skipped). Only the gauges it needs are
// parsed: `name value` or `name{labels} value [timestamp]`; comments, other metrics and
// malformed lines are ignored. Values must be finite, non-negative and below 2^31. It returns
// errBadMetrics when waiting or running is missing.
func parseEngineGauges(r io.Reader) (engineGauges, error) {
	var g engineGauges
	br := bufio.NewReaderSize(io.LimitReader(r, maxMetricsBytes), 4096)
	var hasWaiting, hasRunning bool
	for {
		line, err := readLine(br, maxMetricsLine)
		if len(line) > 0 && line[0] != '#' {
			name, labels, value, ok := splitSample(line)
			if ok {
				switch string(name) {
				case gaugeWaiting:
					g.Waiting, hasWaiting = value, true
				case gaugeRunning:
					g.Running, hasRunning = value, true
				case gaugeKVPool:
					g.KVPool = value
				case gaugeKV:
					switch labelValue(labels, "state") {
					case "free":
						g.KVFree = value
					case "used":
						g.KVUsed = value
					case "cached":
						g.KVCached = value
					}
				}
			}
		}
		if err != nil {
			break
		}
	}
	if !hasWaiting || !hasRunning {
		return engineGauges{}, errBadMetrics
	}
	g.Has = true
	return g, nil
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

// splitSample splits `name{labels} value [timestamp]` (labels optional) and parses the value
// as a gauge count.
func splitSample(line []byte) (name, labels []byte, value int, ok bool) {
	i := bytes.IndexAny(line, "{ \t")
	if i <= 0 {
		return nil, nil, 0, false
	}
	name, rest := line[:i], line[i:]
	if rest[0] == '{' {
		j := closingBrace(rest)
		if j < 0 {
			return nil, nil, 0, false
		}
		labels, rest = rest[1:j], rest[j+1:]
	}
	fields := bytes.Fields(rest)
	if len(fields) < 1 || len(fields) > 2 {
		return nil, nil, 0, false
	}
	v, err := strconv.ParseFloat(string(fields[0]), 64)
	if err != nil || math.IsNaN(v) || v < 0 || v >= 1<<31 {
		return nil, nil, 0, false
	}
	return name, labels, int(v), true
}

// closingBrace returns the index of the '}' closing the label set that s starts with, skipping
// quoted values (with backslash escapes), or -1.
func closingBrace(s []byte) int {
	quoted := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == '}':
			return i
		}
	}
	return -1
}

// labelValue returns the unescaped value of label key in a label set (`k="v",k2="v2"`), or "".
func labelValue(labels []byte, key string) string {
	for len(labels) > 0 {
		eq := bytes.IndexByte(labels, '=')
		if eq < 0 || eq+1 >= len(labels) || labels[eq+1] != '"' {
			return ""
		}
		k := string(bytes.TrimSpace(labels[:eq]))
		rest := labels[eq+2:]
		var val []byte
		end := -1
		for i := 0; i < len(rest); i++ {
			if rest[i] == '\\' && i+1 < len(rest) {
				switch rest[i+1] {
				case 'n':
					val = append(val, '\n')
				default:
					val = append(val, rest[i+1])
				}
				i++
				continue
			}
			if rest[i] == '"' {
				end = i
				break
			}
			val = append(val, rest[i])
		}
		if end < 0 {
			return ""
		}
		if k == key {
			return string(val)
		}
		labels = bytes.TrimLeft(rest[end+1:], ", ")
	}
	return ""
}

package telemetry

import (
	"bufio"
	"context"
	"encoding/hex"
	"io"
	"math"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/cacheblend/cacheblend/telemetry/internal/randid"
)

// ErrorTypeKey is the attribute set by [Span.SetError] (OTel semantic
// conventions: error.type).
const ErrorTypeKey = attribute.Key("error.type")

// ProfileSink serializes span profile lines onto one writer through a
// buffer. Every Write is one complete record; concurrent writers never
// interleave. Buffered data reaches the writer on Flush (the Provider of
// package telemetry/provider flushes on ForceFlush and Shutdown). It is safe
// for concurrent use.
type ProfileSink struct {
	mu  sync.Mutex
	w   io.Writer
	bw  *bufio.Writer // nil: unbuffered
	err error         // first write error, sticky
}

// NewProfileSink returns a buffered (64 KiB) sink writing to w.
func NewProfileSink(w io.Writer) *ProfileSink {
	return &ProfileSink{w: w, bw: bufio.NewWriterSize(w, 64<<10)}
}

// AsProfileSink returns w itself when it is a *ProfileSink, otherwise an
// unbuffered sink serializing writes to w (so no flush is needed).
func AsProfileSink(w io.Writer) *ProfileSink {
	if s, ok := w.(*ProfileSink); ok {
		return s
	}
	return &ProfileSink{w: w}
}

// Write writes p as one record. After a write error every later Write
// returns that error.
func (s *ProfileSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return 0, s.err
	}
	var n int
	if s.bw != nil {
		n, s.err = s.bw.Write(p)
	} else {
		n, s.err = s.w.Write(p)
	}
	return n, s.err
}

// Flush writes the buffered records to the underlying writer.
func (s *ProfileSink) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil && s.bw != nil {
		s.err = s.bw.Flush()
	}
	return s.err
}

// Spans is the span helper of engine and worker code. Start records an
// OpenTelemetry span through the tracer of its provider and, when a profile
// writer is set (CB_PROFILE=1), also writes one JSONL line per ended span:
//
//	{"name":…,"scope":…,"trace_id":…,"span_id":…,"parent_span_id":…,
//	 "start":"<RFC3339Nano UTC>","duration_ms":…,"attributes":{…}}
//
// parent_span_id is "" for a root span. When the tracer records nothing of
// its own (tracing off), ids are generated so that the profile still links
// parents and children, and the generated span context is put in the
// returned context so that it also propagates. Spans is safe for concurrent
// use.
type Spans struct {
	tracer trace.Tracer
	scope  string
	sink   *ProfileSink // nil: no profile
}

// NewSpans returns a span helper using the tracer of tp (a no-op provider
// when nil) named scope. profile, when not nil, receives the JSONL profile:
// a *ProfileSink is used as-is (shared with other helpers), any other writer
// gets unbuffered, serialized writes.
func NewSpans(tp trace.TracerProvider, scope string, profile io.Writer) *Spans {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	s := &Spans{tracer: tp.Tracer(scope), scope: scope}
	if profile != nil {
		s.sink = AsProfileSink(profile)
	}
	return s
}

// Profiling reports whether the helper writes a span profile.
func (s *Spans) Profiling() bool { return s.sink != nil }

// Flush flushes the span profile, if any.
func (s *Spans) Flush() error {
	if s.sink == nil {
		return nil
	}
	return s.sink.Flush()
}

// Span is a span started by [Spans.Start]. A nil *Span is a valid no-op
// span. Its methods are safe for concurrent use.
type Span struct {
	otel trace.Span
	prof *profSpan // nil when not profiling
}

type profSpan struct {
	h      *Spans
	name   string
	sc     trace.SpanContext
	parent trace.SpanID
	start  time.Time

	mu    sync.Mutex
	attrs []attribute.KeyValue
	ended bool
}

// Start starts a span named name as a child of the span in ctx (or a root)
// and returns a context holding it. opts are passed to the tracer (kind,
// attributes, links, timestamp, new root).
func (s *Spans) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, *Span) {
	if s.sink == nil {
		ctx, sp := s.tracer.Start(ctx, name, opts...)
		return ctx, &Span{otel: sp}
	}
	return s.startProfiled(ctx, name, opts)
}

func (s *Spans) startProfiled(ctx context.Context, name string, opts []trace.SpanStartOption) (context.Context, *Span) {
	cfg := trace.NewSpanStartConfig(opts...)
	start := cfg.Timestamp()
	if start.IsZero() {
		start = time.Now()
		// Same start time in the OTel span and the profile line; never
		// append into the caller's backing array.
		opts = append(opts[:len(opts):len(opts)], trace.WithTimestamp(start))
	}
	parent := trace.SpanContextFromContext(ctx)
	if cfg.NewRoot() {
		parent = trace.SpanContext{}
	}
	ctx, sp := s.tracer.Start(ctx, name, opts...)
	sc := sp.SpanContext()
	if !sc.IsValid() || (parent.IsValid() && sc.SpanID() == parent.SpanID()) {
		// The tracer made no span of its own (no-op provider): make ids.
		tid := parent.TraceID()
		if !parent.IsValid() {
			if id, ok := TraceIDFromContext(ctx); ok {
				tid = id
			} else {
				tid = randid.TraceID()
			}
		}
		sc = trace.NewSpanContext(trace.SpanContextConfig{
			TraceID:    tid,
			SpanID:     randid.SpanID(),
			TraceFlags: parent.TraceFlags(),
			TraceState: parent.TraceState(),
		})
		ctx = trace.ContextWithSpanContext(ctx, sc)
	}
	p := &profSpan{h: s, name: name, sc: sc, start: start}
	if parent.IsValid() {
		p.parent = parent.SpanID()
	}
	if attrs := cfg.Attributes(); len(attrs) > 0 {
		p.attrs = append(p.attrs, attrs...)
	}
	return ctx, &Span{otel: sp, prof: p}
}

// SpanContext returns the span's context (ids generated for the profile
// when tracing is off).
func (sp *Span) SpanContext() trace.SpanContext {
	switch {
	case sp == nil:
		return trace.SpanContext{}
	case sp.prof != nil:
		return sp.prof.sc
	}
	return sp.otel.SpanContext()
}

// IsRecording reports whether an OpenTelemetry span is being recorded.
func (sp *Span) IsRecording() bool { return sp != nil && sp.otel.IsRecording() }

// SetAttributes sets attributes on the span (and its profile line).
func (sp *Span) SetAttributes(kv ...attribute.KeyValue) {
	if sp == nil {
		return
	}
	sp.otel.SetAttributes(kv...)
	if p := sp.prof; p != nil {
		p.mu.Lock()
		if !p.ended {
			p.attrs = append(p.attrs, kv...)
		}
		p.mu.Unlock()
	}
}

// AddEvent adds an event to the OpenTelemetry span. Events are not written
// to the profile.
func (sp *Span) AddEvent(name string, opts ...trace.EventOption) {
	if sp == nil {
		return
	}
	sp.otel.AddEvent(name, opts...)
}

// SetError marks the span failed: status Error with err's message (or
// errType when err is nil), the error.type attribute (errType, or "_OTHER"
// when empty), and an exception event for err. Nothing happens when errType
// is empty and err is nil.
func (sp *Span) SetError(errType string, err error) {
	if sp == nil || (errType == "" && err == nil) {
		return
	}
	if errType == "" {
		errType = "_OTHER"
	}
	desc := errType
	if err != nil {
		desc = err.Error()
		sp.otel.RecordError(err)
	}
	sp.otel.SetStatus(codes.Error, desc)
	sp.SetAttributes(ErrorTypeKey.String(errType))
}

// End ends the span and writes its profile line. Only the first End writes
// a line.
//
// Without a timestamp option the end is read from the wall clock here, like
// every start and every explicitly stamped time (the model's phases, the
// blend server's events): the SDK's own default end (start plus the
// monotonic time elapsed) drifts from the wall clock by the clock's slew, so
// a child stamped with wall-clock times could end after its parent.
func (sp *Span) End(opts ...trace.SpanEndOption) {
	if sp == nil {
		return
	}
	p := sp.prof
	if p == nil && !sp.otel.IsRecording() {
		sp.otel.End(opts...)
		return
	}
	cfg := trace.NewSpanEndConfig(opts...)
	end := cfg.Timestamp()
	if end.IsZero() {
		end = time.Now()
		opts = append(opts[:len(opts):len(opts)], trace.WithTimestamp(end))
	}
	sp.otel.End(opts...)
	if p == nil {
		return
	}

	p.mu.Lock()
	if p.ended {
		p.mu.Unlock()
		return
	}
	p.ended = true
	attrs := p.attrs // no appends after ended
	p.mu.Unlock()

	bp := lineBufs.Get().(*[]byte)
	line := appendProfileLine((*bp)[:0], p, end, attrs)
	_, _ = p.h.sink.Write(line) // a broken profile never fails a request
	*bp = line
	lineBufs.Put(bp)
}

var lineBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

func appendProfileLine(b []byte, p *profSpan, end time.Time, attrs []attribute.KeyValue) []byte {
	tid, sid := p.sc.TraceID(), p.sc.SpanID()
	var hexBuf [32]byte
	b = append(b, `{"name":`...)
	b = appendJSONString(b, p.name)
	b = append(b, `,"scope":`...)
	b = appendJSONString(b, p.h.scope)
	b = append(b, `,"trace_id":"`...)
	hex.Encode(hexBuf[:32], tid[:])
	b = append(b, hexBuf[:32]...)
	b = append(b, `","span_id":"`...)
	hex.Encode(hexBuf[:16], sid[:])
	b = append(b, hexBuf[:16]...)
	b = append(b, `","parent_span_id":"`...)
	if p.parent.IsValid() {
		hex.Encode(hexBuf[:16], p.parent[:])
		b = append(b, hexBuf[:16]...)
	}
	b = append(b, `","start":"`...)
	b = p.start.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","duration_ms":`...)
	b = strconv.AppendFloat(b, float64(end.Sub(p.start))/float64(time.Millisecond), 'f', -1, 64)
	b = append(b, `,"attributes":{`...)
	seen := 0
	for i, kv := range attrs {
		if !kv.Valid() || laterKey(attrs[i+1:], kv.Key) {
			continue // last value of a key wins, as in OTel
		}
		if seen > 0 {
			b = append(b, ',')
		}
		seen++
		b = appendJSONString(b, string(kv.Key))
		b = append(b, ':')
		b = appendJSONValue(b, kv.Value)
	}
	return append(b, "}}\n"...)
}

func laterKey(rest []attribute.KeyValue, k attribute.Key) bool {
	for _, kv := range rest {
		if kv.Key == k {
			return true
		}
	}
	return false
}

func appendJSONValue(b []byte, v attribute.Value) []byte {
	switch v.Type() {
	case attribute.BOOL:
		return strconv.AppendBool(b, v.AsBool())
	case attribute.INT64:
		return strconv.AppendInt(b, v.AsInt64(), 10)
	case attribute.FLOAT64:
		return appendJSONFloat(b, v.AsFloat64())
	case attribute.STRING:
		return appendJSONString(b, v.AsString())
	case attribute.BOOLSLICE:
		return appendJSONArray(b, v.AsBoolSlice(), strconv.AppendBool)
	case attribute.INT64SLICE:
		return appendJSONArray(b, v.AsInt64Slice(), func(b []byte, x int64) []byte { return strconv.AppendInt(b, x, 10) })
	case attribute.FLOAT64SLICE:
		return appendJSONArray(b, v.AsFloat64Slice(), appendJSONFloat)
	case attribute.STRINGSLICE:
		return appendJSONArray(b, v.AsStringSlice(), appendJSONString)
	default:
		return appendJSONString(b, v.Emit())
	}
}

func appendJSONArray[T any](b []byte, xs []T, f func([]byte, T) []byte) []byte {
	b = append(b, '[')
	for i, x := range xs {
		if i > 0 {
			b = append(b, ',')
		}
		b = f(b, x)
	}
	return append(b, ']')
}

// appendJSONFloat writes f as a JSON number; NaN and ±Inf, which JSON
// cannot represent, are written as strings.
func appendJSONFloat(b []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return appendJSONString(b, strconv.FormatFloat(f, 'g', -1, 64))
	}
	return strconv.AppendFloat(b, f, 'g', -1, 64)
}

// appendJSONString writes s as a JSON string; invalid UTF-8 becomes U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

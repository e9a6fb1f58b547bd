package scheduler

import (
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

func traceAttrs(kv ...attribute.KeyValue) trace.SpanStartOption { return trace.WithAttributes(kv...) }

func traceEnd(t time.Time) trace.SpanEndOption { return trace.WithTimestamp(t) }

func traceEventAttrs(kv ...attribute.KeyValue) trace.EventOption { return trace.WithAttributes(kv...) }

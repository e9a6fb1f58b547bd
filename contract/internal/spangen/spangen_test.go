package spangen

import (
	"bytes"
	"strings"
	"testing"

	"github.com/cacheblend/cacheblend/contract"
)

func TestIdent(t *testing.T) {
	for name, want := range map[string]string{
		"cb.request":            "CBRequest",
		"cb.lookup.rpc":         "CBLookupRPC",
		"cb.start_load_kv":      "CBStartLoadKV",
		"cb.l2_load":            "CBL2Load",
		"mp.lookup_prefetch":    "MPLookupPrefetch",
		"engine.queue":          "EngineQueue",
		"cb.store_pre_computed": "CBStorePreComputed",
	} {
		if got, err := Ident(name); err != nil || got != want {
			t.Errorf("Ident(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	for _, bad := range []string{"", ".", "9a", "a-b"} {
		if got, err := Ident(bad); err == nil {
			t.Errorf("Ident(%q) = %q, want an error", bad, got)
		}
	}
}

const spans = `version: 1
services: [a, b]
spans:
  - name: "{op} {model}"
    name_pattern: '^op .+$'
    service: a
    kind: server
    phase: request
    required: true
  - name: cb.x_y
    service: a
    kind: internal
    phase: schedule
    parent: "{op} {model}"
    required: true
    attributes: {request_id: string, n: int}
    note: A note
      folded over lines.
  - name: cb.remote
    service: b
    kind: server
    phase: lookup
    parent: cb.x_y
    remote_parent: true
    may_repeat: true
    when: {span: cb.x_y, attribute: n, op: ge, value: 2}
    attributes: {request_id: string}
  - name: ingest.root
    trace: ingest
    service: a
    kind: internal
    phase: store
`

func TestGenerate(t *testing.T) {
	set, err := contract.ParseSpans([]byte(spans))
	if err != nil {
		t.Fatal(err)
	}
	src, err := Generate(set)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Generate(set)
	if !bytes.Equal(src, again) {
		t.Fatal("Generate is not deterministic")
	}
	s := string(src)
	if !strings.HasPrefix(s, Header+"\n\npackage spanname\n") {
		t.Fatalf("header:\n%s", s)
	}
	for _, want := range []string{
		"\tCBXY = \"cb.x_y\"\n",
		"\tCBRemote = \"cb.remote\"\n",
		"\tIngestRoot = \"ingest.root\"\n",
		`// CBXY is the span "cb.x_y" of a (kind internal, phase "schedule"), child of the SERVER span "{op} {model}" (see [Server]); required.`,
		"\t// A note folded over lines.\n",
		`// CBRemote is the span "cb.remote" of b (kind server, phase "lookup"), remote child of [CBXY] in a; required when the parent has n >= 2, else optional; may repeat.`,
		`// IngestRoot is the span "ingest.root" of a (kind internal, phase "store"), the root of the ingest trace; optional.`,
		"// Span names of the request trace",
		"// Span names of the ingest trace",
	} {
		if !strings.Contains(unwrap(s), want) {
			t.Errorf("generated source lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "{op} {model}\"\n") || strings.Contains(s, "= \"{op}") {
		t.Error("a pattern-named span got a constant")
	}
	if strings.Index(s, "request trace") > strings.Index(s, "ingest trace") {
		t.Error("the request trace must come first")
	}
	for l := range strings.Lines(s) {
		if w := len(strings.ReplaceAll(strings.TrimRight(l, "\n"), "\t", "    ")); w > lineWidth {
			t.Errorf("line of %d columns: %s", w, l)
		}
	}
}

// unwrap joins the continuation lines of // comments, so tests can look for a sentence.
func unwrap(src string) string {
	var b strings.Builder
	prevComment := false
	for l := range strings.Lines(src) {
		l = strings.TrimRight(l, "\n")
		t := strings.TrimSpace(l)
		comment := strings.HasPrefix(t, "// ")
		if comment && prevComment {
			b.WriteString(" " + strings.TrimPrefix(t, "// "))
			continue
		}
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		b.WriteString(l)
		prevComment = comment
	}
	return b.String()
}

func TestGenerateRejectsCollidingIdentifiers(t *testing.T) {
	doc := strings.Replace(spans, "  - name: ingest.root\n", "  - name: cb.x.y\n    parent: cb.x_y\n    attributes: {request_id: string}\n", 1)
	doc = strings.Replace(doc, "    trace: ingest\n", "", 1)
	set, err := contract.ParseSpans([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Generate(set); err == nil || !strings.Contains(err.Error(), "CBXY") {
		t.Fatalf("Generate = %v, want a collision error naming CBXY", err)
	}
}

package vocab

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Errors New and SpecFromGGUF wrap.
var (
	// ErrInvalidSpec is wrapped by New's errors for a Spec that is not a
	// consistent vocabulary (mismatched lengths, duplicate tokens, bad
	// merges, special token ids out of range).
	ErrInvalidSpec = errors.New("invalid vocabulary")
	// ErrUnsupported is wrapped by New's errors for a tokenizer model or
	// pre-tokenizer this package does not implement.
	ErrUnsupported = errors.New("unsupported tokenizer")
)

// Token types of tokenizer.ggml.token_type (llama.cpp's llama_token_type).
const (
	TypeUndefined   int32 = 0
	TypeNormal      int32 = 1
	TypeUnknown     int32 = 2
	TypeControl     int32 = 3
	TypeUserDefined int32 = 4
	TypeUnused      int32 = 5
	TypeByte        int32 = 6
)

// Token attributes (llama.cpp's llama_token_attr).
const (
	attrUnknown     = 1 << 0
	attrUnused      = 1 << 1
	attrNormal      = 1 << 2
	attrControl     = 1 << 3
	attrUserDefined = 1 << 4
	attrByte        = 1 << 5
	attrLStrip      = 1 << 7
	attrRStrip      = 1 << 8

	attrSpecial = attrUnknown | attrControl // pieces hidden unless special
)

// Spec is what New needs: a tokenizer as a GGUF file's tokenizer.ggml.*
// keys describe it (SpecFromGGUF reads one). The slices are not modified
// by New nor kept.
type Spec struct {
	// Model is tokenizer.ggml.model: "llama" (SentencePiece BPE with
	// scores and byte fallback) or "gpt2" (byte-level BPE with merges).
	Model string
	// Pre is tokenizer.ggml.pre, the pre-tokenizer of a gpt2 model (""
	// means "default", as in llama.cpp); see SupportedPre. Ignored for
	// llama models.
	Pre string
	// Tokens are the token texts by id (tokenizer.ggml.tokens); an empty
	// text becomes "[EMPTY_<id>]" as in llama.cpp.
	Tokens []string
	// Scores (tokenizer.ggml.scores) rank the merges of a llama model; nil
	// means all 0. Otherwise len(Scores) must be len(Tokens).
	Scores []float32
	// Types are the token types (tokenizer.ggml.token_type, the Type*
	// constants); nil means all TypeNormal. Otherwise len(Types) must be
	// len(Tokens).
	Types []int32
	// Merges are a gpt2 model's merges, "left right", by rank
	// (tokenizer.ggml.merges).
	Merges []string
	// Specials are the special token ids; each must be -1 or a token id.
	Specials
	// AddBOS and AddEOS: Tokenize with addSpecial adds BOS first / EOS last
	// (tokenizer.ggml.add_bos_token / add_eos_token, whose defaults
	// SpecFromGGUF applies). AddSpacePrefix: a llama model prefixes text
	// with a space (tokenizer.ggml.add_space_prefix; default true for
	// llama, false for gpt2).
	AddBOS, AddEOS, AddSpacePrefix bool
	// Name and Arch are general.name and general.architecture, which
	// llama.cpp uses to set per-token strip attributes (Phi-3's special
	// tokens strip the whitespace after them).
	Name, Arch string
}

// Specials are a tokenizer's special token ids; -1 means none. EOT, EOM
// and the fill-in-the-middle (FIM) ids, when -1, are found by their text
// as llama.cpp does (e.g. "<|eot_id|>", "<|im_end|>"), which also makes
// the token a control token. The FIM pad, repository and file-separator
// ids end generation.
type Specials struct {
	BOS, EOS, UNK, PAD, EOT, EOM, SEP              int32
	FIMPre, FIMSuf, FIMMid, FIMPad, FIMRep, FIMSep int32
}

// specialID is one id of a Specials, with its name in New's errors and
// its GGUF key (tokenizer.ggml.<key>).
type specialID struct {
	name, key string
	id        *int32
}

// ids lists p's ids in field order.
func (p *Specials) ids() []specialID {
	return []specialID{{"BOS", "bos_token_id", &p.BOS}, {"EOS", "eos_token_id", &p.EOS},
		{"UNK", "unknown_token_id", &p.UNK}, {"PAD", "padding_token_id", &p.PAD},
		{"EOT", "eot_token_id", &p.EOT}, {"EOM", "eom_token_id", &p.EOM},
		{"SEP", "seperator_token_id", &p.SEP}, {"FIM pre", "fim_pre_token_id", &p.FIMPre},
		{"FIM suf", "fim_suf_token_id", &p.FIMSuf}, {"FIM mid", "fim_mid_token_id", &p.FIMMid},
		{"FIM pad", "fim_pad_token_id", &p.FIMPad}, {"FIM rep", "fim_rep_token_id", &p.FIMRep},
		{"FIM sep", "fim_sep_token_id", &p.FIMSep}}
}

// DefaultSpec returns a Spec with llama.cpp's defaults for a model and
// pre-tokenizer: the default special ids (llama: BOS 1, EOS 2, UNK 0;
// gpt2: BOS = EOS = 11, unless the pre-tokenizer has none; the others -1)
// and flags (llama: AddBOS and AddSpacePrefix; gpt2: AddBOS for the Llama 3
// family). Tokens, scores, types and merges are left empty. New rejects
// ids out of range (SpecFromGGUF drops defaults that are), so adjust the
// ids to the tokens.
func DefaultSpec(model, pre string) Spec {
	s := Spec{Model: model, Pre: pre}
	for _, sp := range s.ids() {
		*sp.id = -1
	}
	switch model {
	case "llama":
		s.BOS, s.EOS, s.UNK = 1, 2, 0
		s.AddBOS, s.AddSpacePrefix = true, true
	case "gpt2":
		s.BOS, s.EOS = 11, 11
		if p, ok := preTokenizers[pre]; ok {
			s.AddBOS = p.addBOS
			if p.noBOS {
				s.BOS = -1
			}
		}
	}
	return s
}

type modelKind uint8

const (
	modelSPM modelKind = iota + 1
	modelBPE
)

// pair is a BPE merge's two sides.
type pair struct{ left, right string }

// Vocab is a tokenizer built by New. It is immutable and safe for
// concurrent use.
type Vocab struct {
	model modelKind
	pre   preInfo // gpt2 only
	split []splitter

	// The tokens by id: text, score, attributes and
	// llama_token_to_piece(special = true).
	tokens texts
	scores []float32
	attrs  []uint32
	pieces texts // every token's piece
	toID   tokenIndex
	ranks  mergeRanks // gpt2 merges

	// ids are the given special ids and those found by text.
	ids                            Specials
	addBOS, addEOS, addSpacePrefix bool
	// specials are the control, user-defined and unknown ids, longest text
	// first (llama.cpp's cache_special_tokens).
	specials []int32
	eog      []int32    // ascending
	byteTok  [256]int32 // SPM byte fallback ids, -1: none

	cache    *wordCache
	spmPairs pairSet // SPM: characters adjacent in some token
	trie     *specialTrie
}

// New builds a Vocab from s, validating it: token, score and type counts
// agree, token texts are distinct, merges have the form "left right",
// special ids are in range, and the model and pre-tokenizer are supported
// (errors wrap ErrInvalidSpec or ErrUnsupported). New never panics. The
// Vocab may keep s.Tokens (not a copy): the caller must not modify it
// afterwards.
func New(s Spec) (*Vocab, error) {
	v := &Vocab{ids: s.Specials, addBOS: s.AddBOS, addEOS: s.AddEOS, addSpacePrefix: s.AddSpacePrefix}
	switch s.Model {
	case "llama":
		v.model = modelSPM
	case "gpt2":
		v.model = modelBPE
		p, ok := preTokenizers[s.Pre]
		if !ok {
			return nil, fmt.Errorf("vocab: unsupported pre-tokenizer %q; supported: %s: %w",
				s.Pre, strings.Join(SupportedPre(), ", "), ErrUnsupported)
		}
		v.pre, v.split = p, p.kind.splitters()
	default:
		return nil, fmt.Errorf("vocab: unsupported tokenizer model %q; supported: llama, gpt2: %w", s.Model, ErrUnsupported)
	}
	if err := v.setTokens(s); err != nil {
		return nil, err
	}
	if v.model == modelBPE {
		if err := v.setMerges(s.Merges); err != nil {
			return nil, err
		}
	}
	n := int32(v.tokens.len())
	for _, sp := range v.ids.ids() {
		if *sp.id < -1 || *sp.id >= n {
			return nil, fmt.Errorf("vocab: %s token id %d out of range [0, %d): %w", sp.name, *sp.id, n, ErrInvalidSpec)
		}
	}
	if s.AddBOS && s.BOS < 0 {
		return nil, fmt.Errorf("vocab: add_bos set but no BOS token: %w", ErrInvalidSpec)
	}
	if s.AddEOS && s.EOS < 0 {
		return nil, fmt.Errorf("vocab: add_eos set but no EOS token: %w", ErrInvalidSpec)
	}
	v.findByText()
	v.setEOG()
	for i := range n {
		if v.attrs[i]&(attrControl|attrUserDefined|attrUnknown) != 0 {
			v.specials = append(v.specials, i)
		}
	}
	slices.SortStableFunc(v.specials, func(a, b int32) int { return len(v.tokens.at(int(b))) - len(v.tokens.at(int(a))) })
	if err := v.setPieces(); err != nil {
		return nil, err
	}
	v.setStrip(s)
	for b := range v.byteTok {
		v.byteTok[b] = -1
		if v.model == modelSPM {
			if id, ok := v.toID.id(fmt.Sprintf("<0x%02X>", b)); ok {
				v.byteTok[b] = id
			} else if id, ok := v.toID.id(string([]byte{byte(b)})); ok {
				v.byteTok[b] = id
			}
		}
	}
	v.cache = newWordCache()
	if v.model == modelSPM {
		v.spmPairs = spmPairSet(v.tokens)
	}
	v.trie = newSpecialTrie(v)
	return v, nil
}

// setTokens checks and stores the tokens, their scores and attributes.
func (v *Vocab) setTokens(s Spec) error {
	n := len(s.Tokens)
	switch {
	case n == 0:
		return fmt.Errorf("vocab: no tokens: %w", ErrInvalidSpec)
	case n > math.MaxInt32:
		return fmt.Errorf("vocab: %d tokens: %w", n, ErrInvalidSpec)
	case s.Scores != nil && len(s.Scores) != n:
		return fmt.Errorf("vocab: %d scores for %d tokens: %w", len(s.Scores), n, ErrInvalidSpec)
	case s.Types != nil && len(s.Types) != n:
		return fmt.Errorf("vocab: %d token types for %d tokens: %w", len(s.Types), n, ErrInvalidSpec)
	}
	// The tokens are copied into one buffer (texts), an empty one under
	// llama.cpp's name for it.
	tokens := s.Tokens
	if slices.Contains(s.Tokens, "") {
		tokens = slices.Clone(s.Tokens)
	}
	v.scores = make([]float32, n)
	v.attrs = make([]uint32, n)
	for i, t := range tokens {
		if t == "" {
			tokens[i] = fmt.Sprintf("[EMPTY_%d]", i)
		}
		if s.Scores != nil {
			v.scores[i] = s.Scores[i]
		}
		v.attrs[i] = attrNormal
		if s.Types != nil {
			v.attrs[i] = typeAttr(s.Types[i])
		}
	}
	var ok bool
	if v.tokens, ok = newTexts(tokens); !ok {
		return fmt.Errorf("vocab: token texts of 4 GiB or more: %w", ErrInvalidSpec)
	}
	var j, i int32
	if v.toID, j, i = newTokenIndex(v.tokens); i >= 0 {
		return fmt.Errorf("vocab: token %d %q repeats token %d: %w", i, tokens[i], j, ErrInvalidSpec)
	}
	return nil
}

// setMerges checks and stores a gpt2 model's merge ranks.
func (v *Vocab) setMerges(merges []string) error {
	byID := make([]idMerge, 0, len(merges))
	for i, m := range merges {
		k := -1 // the first space after the first byte, as llama.cpp's find(' ', 1)
		if len(m) > 1 {
			if j := strings.IndexByte(m[1:], ' '); j >= 0 {
				k = j + 1
			}
		}
		if k < 0 {
			return fmt.Errorf("vocab: merge %d %q is not \"left right\": %w", i, m, ErrInvalidSpec)
		}
		left, right := m[:k], m[k+1:]
		l, lok := v.toID.id(left)
		r, rok := v.toID.id(right)
		if lok && rok {
			byID = append(byID, idMerge{l, r, int32(i)})
			continue
		}
		if v.ranks.other == nil {
			v.ranks.other = map[pair]int32{}
		}
		if _, seen := v.ranks.other[pair{left, right}]; !seen {
			v.ranks.other[pair{left, right}] = int32(i)
		}
	}
	v.ranks.setByID(v.tokens.len(), byID)
	return nil
}

// typeAttr maps a token type to its attribute as llama.cpp's loader does.
func typeAttr(t int32) uint32 {
	attrs := [...]uint32{TypeNormal: attrNormal, TypeUnknown: attrUnknown, TypeControl: attrControl,
		TypeUserDefined: attrUserDefined, TypeUnused: attrUnused, TypeByte: attrByte}
	if t < 0 || int(t) >= len(attrs) {
		return 0 // TypeUndefined and unknown types
	}
	return attrs[t]
}

// findByText follows llama_vocab::impl::load after the token list: the
// EOT, EOM and FIM ids not given are found by their text (made control
// tokens), then control tokens whose text says "unused" are marked so.
func (v *Vocab) findByText() {
	var order []int32
	// find sets *id, when not given, to the candidate llama.cpp finds
	// first in its token map's iteration order (see stdMapOrder).
	find := func(id *int32, texts ...string) {
		if *id >= 0 {
			return
		}
		var found []int32
		for _, t := range texts {
			if i, ok := v.toID.id(t); ok {
				found = append(found, i)
			}
		}
		switch {
		case len(found) == 0:
			return
		case len(found) > 1:
			if order == nil {
				order = stdMapOrder(v.tokens)
			}
			if order == nil { // too large to lay out: the lowest id
				found[0] = slices.Min(found)
				break
			}
			for _, i := range order {
				if slices.Contains(found, i) {
					found[0] = i
					break
				}
			}
		}
		*id = found[0]
		v.attrs[found[0]] |= attrControl
	}
	p := &v.ids
	find(&p.EOT, "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
		"<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
	find(&p.EOM, "<|eom_id|>")
	find(&p.FIMPre, "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>")
	find(&p.FIMSuf, "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>")
	find(&p.FIMMid, "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>")
	find(&p.FIMPad, "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
	find(&p.FIMRep, "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
	find(&p.FIMSep, "<|file_sep|>")

	for i := range v.attrs {
		if v.attrs[i]&attrControl != 0 && strings.Contains(v.tokens.at(i), "unused") {
			v.attrs[i] |= attrUnused
		}
	}
}

// setEOG builds the end-of-generation set as llama.cpp does: the FIM
// pad/repo/separator ids, the tokens with end-of-generation texts (made
// control tokens), EOS, EOT and EOM, less llama.cpp's workarounds for
// gpt-oss and Gemma 4.
func (v *Vocab) setEOG() {
	eog := map[int32]bool{}
	for i, t := range v.tokens.all() {
		switch t {
		case "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
			"<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
			"<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
			"<｜end▁of▁sentence｜>", "[e~[":
			eog[int32(i)] = true
			v.attrs[i] |= attrControl
		}
	}
	for i, t := range v.tokens.all() {
		switch t {
		case "<|channel|>", "<|message|>", "<|start|>", "<|constrain|>":
			v.attrs[i] = attrUserDefined
		}
	}
	for _, id := range []int32{v.ids.FIMPad, v.ids.FIMRep, v.ids.FIMSep, v.ids.EOS, v.ids.EOT, v.ids.EOM} {
		if id >= 0 {
			eog[id] = true
		}
	}
	has := func(text string) (int32, bool) {
		id, ok := v.toID.id(text)
		return id, ok && eog[id]
	}
	_, ret := has("<|return|>")
	_, call := has("<|call|>")
	_, calls := has("<|calls|>")
	_, flush := has("<|flush|>")
	if end, ok := has("<|end|>"); ok && ((ret && (call || calls)) || ((call || calls) && flush)) {
		delete(eog, end)
		v.attrs[end] = attrUserDefined
	}
	if _, tr := has("<|tool_response>"); tr {
		if sid, ok := has("</s>"); ok {
			delete(eog, sid)
			v.attrs[sid] = attrNormal
		}
	}
	v.eog = slices.Sorted(maps.Keys(eog))
}

// setStrip sets the per-token strip attributes llama.cpp sets by model
// name, architecture or pre-tokenizer.
func (v *Vocab) setStrip(s Spec) {
	name := strings.ToLower(s.Name)
	setAttr := func(text string, attr uint32, on bool) {
		if id, ok := v.toID.id(text); ok {
			if on {
				v.attrs[id] |= attr
			} else {
				v.attrs[id] &^= attr
			}
		}
	}
	containsAny := func(s string, subs ...string) bool {
		return slices.ContainsFunc(subs, func(sub string) bool { return strings.Contains(s, sub) })
	}
	switch {
	case containsAny(s.Pre, "jina-v2-de", "jina-v2-es", "jina-v2-code") || containsAny(s.Arch, "nomic-bert-moe", "jina-bert-v3"):
		setAttr("<mask>", attrLStrip, true)
	case containsAny(name, "phi-3", "phi3"):
		for _, id := range v.specials {
			v.attrs[id] |= attrRStrip
		}
		setAttr("</s>", attrRStrip, true)
		for _, t := range []string{"<unk>", "<s>", "<|endoftext|>"} {
			setAttr(t, attrRStrip, false)
		}
	case containsAny(name, "modern-bert"):
		setAttr("[MASK]", attrLStrip, true)
	}
}

// computePiece is llama_token_to_piece(special = true) without the cache.
func (v *Vocab) computePiece(id int32) string {
	attr, text := v.attrs[id], v.tokens.at(int(id))
	switch {
	case attr&(attrSpecial|attrUserDefined) != 0:
		return text
	case attr&attrNormal != 0:
		if v.model == modelSPM {
			return strings.ReplaceAll(text, "\u2581", " ")
		}
		return decodeByteLevel(text)
	case attr&attrByte != 0:
		return string([]byte{tokenByte(text)})
	}
	return ""
}

// setPieces computes every token's piece into v.pieces.
func (v *Vocab) setPieces() error {
	n := int32(v.tokens.len())
	v.pieces = texts{end: make([]uint32, 0, n)}
	for i := range n {
		if !v.pieces.add(v.computePiece(i)) {
			return fmt.Errorf("vocab: the tokens' pieces reach 4 GiB: %w", ErrInvalidSpec)
		}
	}
	v.pieces.data = slices.Clip(v.pieces.data)
	return nil
}

// decodeByteLevel is llama_decode_text: GPT-2's codepoint→byte map undone,
// with llama.cpp's "[UNK_BYTE_0x…]" for codepoints outside the map.
func decodeByteLevel(text string) string {
	var out, enc []byte
	for off := 0; off < len(text); {
		c, n := decodeCpt(text, off)
		off += n
		enc = appendCptUTF8(enc[:0], c)
		if b, ok := unicodeToByte[string(enc)]; ok {
			out = append(out, b)
			continue
		}
		out = append(out, "[UNK_BYTE_0x"...)
		for _, b := range enc {
			out = fmt.Appendf(out, "%02x", b)
		}
		out = append(out, text...)
		out = append(out, ']')
	}
	return string(out)
}

// tokenByte is llama.cpp's token_to_byte: strtol(text.substr(3, 2), 16).
func tokenByte(text string) byte {
	if len(text) < 3 {
		return 0
	}
	s := strings.TrimLeft(text[3:min(len(text), 5)], " \t\n\v\f\r")
	neg := strings.HasPrefix(s, "-")
	if s != "" && (s[0] == '+' || s[0] == '-') {
		s = s[1:]
	}
	// The hex digits up to the first other byte; none reads as 0.
	if i := strings.IndexFunc(s, func(r rune) bool { return !strings.ContainsRune("0123456789abcdefABCDEF", r) }); i >= 0 {
		s = s[:i]
	}
	x, _ := strconv.ParseInt(s, 16, 64)
	if neg {
		x = -x
	}
	return byte(x)
}

// Size is the number of tokens.
func (v *Vocab) Size() int { return v.tokens.len() }

// BOS is the beginning-of-sequence id (-1: none).
func (v *Vocab) BOS() int32 { return v.ids.BOS }

// EOS is the end-of-sequence id (-1: none).
func (v *Vocab) EOS() int32 { return v.ids.EOS }

// EOT is the end-of-turn id, given or found by text (-1: none).
func (v *Vocab) EOT() int32 { return v.ids.EOT }

// AddBOS reports whether Tokenize with addSpecial prepends BOS.
func (v *Vocab) AddBOS() bool { return v.addBOS }

// AddEOS reports whether Tokenize with addSpecial appends EOS.
func (v *Vocab) AddEOS() bool { return v.addEOS }

// EOG returns the end-of-generation ids, ascending, as llama.cpp's
// special_eog_ids: EOS, EOT, EOM, the FIM pad/repo/file-separator ids and
// every token whose text llama.cpp lists ("<|eot_id|>", "<|im_end|>",
// "<|end|>", "<end_of_turn>", "<|endoftext|>", …). The slice is a copy.
func (v *Vocab) EOG() []int32 { return slices.Clone(v.eog) }

// IsEOG reports whether id ends generation.
func (v *Vocab) IsEOG(id int32) bool {
	_, ok := slices.BinarySearch(v.eog, id)
	return ok
}

// IsSpecial reports whether id is a control, unknown or user-defined token
// (the tokens Tokenize with parseSpecial matches by text; user-defined ones
// are matched even without it). False for ids out of range.
func (v *Vocab) IsSpecial(id int32) bool {
	return v.valid(id) && v.attrs[id]&(attrControl|attrUserDefined|attrUnknown) != 0
}

// TokenText is the text of id as stored in the vocabulary ("" for ids out
// of range).
func (v *Vocab) TokenText(id int32) string {
	if !v.valid(id) {
		return ""
	}
	return v.tokens.at(int(id))
}

// ID returns the id whose text is text.
func (v *Vocab) ID(text string) (int32, bool) {
	id, ok := v.toID.id(text)
	return id, ok
}

func (v *Vocab) valid(id int32) bool { return id >= 0 && int(id) < v.tokens.len() }

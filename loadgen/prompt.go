package loadgen

import (
	"math/rand/v2"
	"strings"
)

// questions end the prompts, one per request in turn.
var questions = []string{
	"Question: which technique in these documents shortens the time to the first token, and why?",
	"Question: how do the documents above keep memory use bounded?",
	"Question: what does each document say about measuring latency?",
	"Question: summarise the documents above in one sentence each.",
	"Question: which two documents depend on each other, and how?",
}

// fillerWords make the filler prefix; ASCII, so one byte is one byte-level token.
var fillerWords = strings.Fields(`the of a serving engine keeps caches warm while requests queue behind
batches tokens flow through attention layers rotary positions shift blocks page memory tiers
store values keys latency budgets burn slowly under steady load`)

// promptHeader opens the RAG instructions, after the filler.
const promptHeader = "Answer using only these documents.\n\n"

// prompt is the user message of one request.
type prompt struct {
	content string
	docs    []string // document IDs in prompt order
	offsets []int    // byte offset of each document in content
	prefix  int      // filler bytes
}

// promptGen builds request i's prompt deterministically from (seed, i). Safe for concurrent use.
type promptGen struct {
	docs      []Document
	k         int
	maxPrefix int
	seed      uint64
}

func (g promptGen) build(i int) prompt {
	rng := rand.New(rand.NewPCG(g.seed, uint64(i)))
	perm := rng.Perm(len(g.docs))[:g.k]
	n := 0
	if g.maxPrefix > 0 {
		n = rng.IntN(g.maxPrefix + 1)
	}
	var sb strings.Builder
	writeFiller(&sb, rng, n)
	sb.WriteString(promptHeader)
	p := prompt{prefix: n, docs: make([]string, len(perm)), offsets: make([]int, len(perm))}
	for j, k := range perm {
		p.docs[j], p.offsets[j] = g.docs[k].ID, sb.Len()
		sb.WriteString(g.docs[k].Text)
		sb.WriteString("\n\n")
	}
	sb.WriteString(questions[i%len(questions)])
	p.content = sb.String()
	return p
}

// writeFiller writes exactly n bytes of filler words, then a blank line; nothing for n ≤ 0.
func writeFiller(sb *strings.Builder, rng *rand.Rand, n int) {
	if n <= 0 {
		return
	}
	buf := make([]byte, 0, n+16)
	for len(buf) < n {
		if len(buf) > 0 {
			buf = append(buf, ' ')
		}
		buf = append(buf, fillerWords[rng.IntN(len(fillerWords))]...)
	}
	sb.Write(buf[:n])
	sb.WriteString("\n\n")
}

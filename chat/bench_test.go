package chat

import "testing"

// benchTemplates are rendered by the benchmarks with the Check probe (4 messages).
var benchTemplates = []string{
	"meta-llama-Llama-3.1-8B-Instruct",
	"Qwen-Qwen2.5-7B-Instruct",
	"HuggingFaceTB-SmolLM3-3B",
	"mistralai-Mistral-Nemo-Instruct-2407",
	"google-gemma-2-2b-it",
}

func BenchmarkRender(b *testing.B) {
	for _, name := range benchTemplates {
		tm := mustParse(b, templateFile(b, name))
		msgs := probe
		if name == "google-gemma-2-2b-it" {
			msgs = probe[1:]
		}
		o := Options{BOS: "<s>", EOS: "</s>", AddGenerationPrompt: true, Now: fixedNow}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tm.Render(msgs, o); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkParse(b *testing.B) {
	src := templateFile(b, "meta-llama-Llama-3.1-8B-Instruct")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(src); err != nil {
			b.Fatal(err)
		}
	}
}

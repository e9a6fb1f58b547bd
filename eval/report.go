package eval

import (
	"cmp"
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// WriteTable writes the report as a table, one row per configuration:
// the quality columns, then the stack's TTFT figures (when measured), then
// the model-only times.
func (r Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "CacheBlend quality and speed on %s (%d layers, check layer %d): %d prompts of %.0f tokens (%.0f in documents), K = %d\n",
		r.Model, r.Layers, r.CheckLayer, r.Prompts, r.PromptTokens, r.DocTokens, r.Positions)
	if s := r.Stack; s != nil {
		fmt.Fprintf(w, "TTFT through the stack: median of %d requests per configuration (%d per prompt) and as many full prefills, prompts of %.0f tokens there\n",
			r.Prompts*s.Repeats, s.Repeats, s.PromptTokens)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "rule\tratio\tfirst-token KL\tmean KL (K)\ttop-1\tgreedy K match\t"
	if r.Stack != nil {
		head += "TTFT full ms\tTTFT blend ms\tTTFT speedup\tnon-prefix hit\t"
	}
	fmt.Fprintln(tw, head+"model full ms\tmodel blend ms\tmodel speedup\t")
	for _, p := range r.Points {
		fmt.Fprintf(tw, "%s\t%.2f\t%.5f\t%.5f\t%.3f\t%.2f\t", p.Rule, p.Ratio, p.FirstKL, p.MeanKL, p.Top1, p.GreedyMatch)
		if r.Stack != nil {
			fmt.Fprintf(tw, "%.1f\t%.1f\t%.2fx\t%.0f\t", p.FullTTFTMs, p.BlendTTFTMs, p.TTFTSpeedup, p.NonPrefixHitTokens)
		}
		fmt.Fprintf(tw, "%.1f\t%.1f\t%.2fx\t\n", p.FullMs, p.BlendMs, p.ModelSpeedup)
	}
	return tw.Flush()
}

// curves are the chart's series: each selection rule from full reuse
// (ratio 0) to a full recompute (ratio 1).
func (r Report) curves() map[string][]Point {
	out := map[string][]Point{}
	for _, rule := range []string{"hkvd", "random"} {
		for _, p := range r.Points {
			if p.Rule == rule || p.Rule == "full_reuse" || p.Ratio == 1 {
				out[rule] = append(out[rule], p)
			}
		}
		slices.SortFunc(out[rule], func(a, b Point) int { return cmp.Compare(a.Ratio, b.Ratio) })
	}
	return out
}

// klFloor is the smallest KL the chart's log scale shows (a full
// recompute's KL is 0).
const klFloor = 1e-5

// WriteSVG draws quality loss (mean first-token KL, log scale) against
// speedup (Point.Speedup: the stack's TTFT speedup when measured), one
// curve per selection rule, each point labelled with its
// recompute ratio, like the CacheBlend paper's figures.
func (r Report) WriteSVG(w io.Writer) error {
	const W, H, left, right, top, bottom = 720.0, 440.0, 80.0, 150.0, 50.0, 60.0
	maxX, maxKL := 1.0, klFloor*10
	for _, p := range r.Points {
		maxX = math.Max(maxX, p.Speedup())
		maxKL = math.Max(maxKL, p.FirstKL)
	}
	maxX = math.Ceil(maxX + 0.25)
	lo, hi := math.Log10(klFloor), math.Ceil(math.Log10(maxKL))
	px := func(x float64) float64 { return left + x/maxX*(W-left-right) }
	py := func(kl float64) float64 {
		v := math.Log10(math.Max(kl, klFloor))
		return top + (hi-v)/(hi-lo)*(H-top-bottom)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="24" font-size="15">CacheBlend on %s: quality loss against speedup (%d prompts)</text>`+"\n",
		left, html.EscapeString(r.Model), r.Prompts)
	// Axes, ticks and grid.
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, H-bottom, W-right, H-bottom)
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", left, top, left, H-bottom)
	for x := 0.0; x <= maxX; x++ {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.1f" y="%.1f" text-anchor="middle">%.0fx</text>`+"\n",
			px(x), top, px(x), H-bottom, px(x), H-bottom+18, x)
	}
	for e := lo; e <= hi; e++ {
		y := top + (hi-e)/(hi-lo)*(H-top-bottom)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.1f" y="%.1f" text-anchor="end">1e%.0f</text>`+"\n",
			left, y, W-right, y, left-6, y+4, e)
	}
	xLabel := "prefill speedup over a full prefill (model only)"
	if r.Stack != nil {
		xLabel = "TTFT speedup over a full prefill (through the stack, median)"
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", (left+W-right)/2, H-18, xLabel)
	fmt.Fprintf(&b, `<text transform="translate(20,%.1f) rotate(-90)" text-anchor="middle">first-token KL(full ‖ blend), nats (log)</text>`+"\n", (top+H-bottom)/2)
	colors := map[string]string{"hkvd": "#1f77b4", "random": "#ff7f0e"}
	names := map[string]string{"hkvd": "HKVD (CacheBlend)", "random": "random tokens"}
	curves := r.curves()
	for i, rule := range []string{"hkvd", "random"} {
		pts := curves[rule]
		var path []string
		for _, p := range pts {
			path = append(path, fmt.Sprintf("%.1f,%.1f", px(p.Speedup()), py(p.FirstKL)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", colors[rule], strings.Join(path, " "))
		for _, p := range pts {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s"/>`+"\n", px(p.Speedup()), py(p.FirstKL), colors[rule])
			if rule == "hkvd" || (p.Ratio > 0 && p.Ratio < 1) {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="%s">%g</text>`+"\n", px(p.Speedup())+6, py(p.FirstKL)-6, colors[rule], p.Ratio)
			}
		}
		ly := top + 20 + float64(i)*20
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/><text x="%.1f" y="%.1f">%s</text>`+"\n",
			W-right+10, ly, W-right+30, ly, colors[rule], W-right+35, ly+4, names[rule])
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#555">labels: recompute ratio</text>`+"\n", W-right+10, top+70)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

package main

import (
	"slices"
	"testing"

	"github.com/cacheblend/cacheblend/demo"
	"github.com/cacheblend/cacheblend/model"
)

func TestServedShape(t *testing.T) {
	d := model.DefaultConfig()
	def := demo.Shape{Layers: d.Layers, CheckLayer: d.CheckLayer, RecompRatio: d.RecompRatio}
	tests := []struct {
		name string
		args []string
		want demo.Shape
	}{
		{name: "no worker args: the default model", want: def},
		{name: "layers and ratio given, other flags ignored", args: []string{"--layers=16", "--dim=256", "--recomp-ratio", "0.2"},
			want: demo.Shape{Layers: 16, CheckLayer: d.CheckLayer, RecompRatio: 0.2}},
		{name: "check layer given", args: []string{"--check-layer=2"}, want: demo.Shape{Layers: d.Layers, CheckLayer: 2, RecompRatio: d.RecompRatio}},
		{name: "malformed value: the default", args: []string{"--layers=many"}, want: def},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := servedShape(tc.args); got != tc.want {
				t.Fatalf("servedShape(%q) = %+v, want %+v", tc.args, got, tc.want)
			}
		})
	}
}

func TestDemoQualityArgs(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		tp       int
		wantOff  string
		wantArgs []string
	}{
		{name: "defaults: the checker runs, budget 1 added", wantArgs: []string{"--quality-budget=1"}},
		{name: "a rate given", args: []string{"--quality-sample-rate=0.2"}, wantArgs: []string{"--quality-sample-rate=0.2", "--quality-budget=1"}},
		{name: "rate 0: checker off", args: []string{"--quality-sample-rate", "0"}, wantOff: "the workers run with --quality-sample-rate 0 (their checker is off)",
			wantArgs: []string{"--quality-sample-rate", "0", "--quality-budget=1"}},
		{name: "tensor-parallel", tp: 2, wantOff: "tensor-parallel workers (--tp) do not check quality", wantArgs: []string{"--quality-budget=1"}},
		{name: "the user's budget kept", args: []string{"--quality-budget=0.5"}, wantArgs: []string{"--quality-budget=0.5"}},
		{name: "the user's budget kept, separate value", args: []string{"--quality-budget", "0.5", "--layers=4"}, wantArgs: []string{"--quality-budget", "0.5", "--layers=4"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := qualityOff(tc.args, tc.tp); got != tc.wantOff {
				t.Errorf("qualityOff = %q, want %q", got, tc.wantOff)
			}
			in := slices.Clone(tc.args)
			if got := demoWorkerArgs(in); !slices.Equal(got, tc.wantArgs) {
				t.Errorf("demoWorkerArgs = %q, want %q", got, tc.wantArgs)
			}
			if !slices.Equal(in, tc.args) {
				t.Errorf("demoWorkerArgs changed its argument: %q", in)
			}
		})
	}
}

package main

import (
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

package worker

import (
	"math"
	"testing"

	"github.com/cacheblend/cacheblend/model"
	"github.com/cacheblend/cacheblend/rpc/cbv1"
)

func TestBlendRule(t *testing.T) {
	tests := []struct {
		name    string
		plan    *cbv1.CBPlan
		want    model.BlendInput
		wantErr bool
	}{
		{"deviation", &cbv1.CBPlan{RecompRatio: 0.15}, model.BlendInput{RecompRatio: 0.15, Select: model.SelectDeviation}, false},
		{"zero ratio is no recompute", &cbv1.CBPlan{}, model.BlendInput{RecompRatio: 0}, false},
		{"random seeded", &cbv1.CBPlan{RecompRatio: 0.3, Selection: cbv1.Selection_SELECTION_RANDOM, SelectionSeed: 9},
			model.BlendInput{RecompRatio: 0.3, Select: model.SelectRandom, SelectSeed: 9}, false},
		{"ratio above one", &cbv1.CBPlan{RecompRatio: 1.01}, model.BlendInput{}, true},
		{"negative ratio", &cbv1.CBPlan{RecompRatio: -0.5}, model.BlendInput{}, true},
		{"NaN ratio", &cbv1.CBPlan{RecompRatio: math.NaN()}, model.BlendInput{}, true},
		{"unknown rule", &cbv1.CBPlan{RecompRatio: 0.1, Selection: 7}, model.BlendInput{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := blendRule(tc.plan)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %v", err, tc.wantErr)
			}
			if err == nil && (got.RecompRatio != tc.want.RecompRatio || got.Select != tc.want.Select || got.SelectSeed != tc.want.SelectSeed) {
				t.Fatalf("rule %+v, want %+v", got, tc.want)
			}
		})
	}
}

package mtls

import (
	"slices"
	"testing"
)

// TestWorkerPolicy: the worker's services admit exactly their callers: the
// engine on WorkerService and health, only workers on KVTransferService.
func TestWorkerPolicy(t *testing.T) {
	p := WorkerPolicy()
	for method, want := range map[string][]Role{
		"/cacheblend.v1.WorkerService/Execute":     {Engine},
		"/cacheblend.v1.WorkerService/PullKV":      {Engine},
		"/grpc.health.v1.Health/Check":             {Engine},
		"/cacheblend.v1.KVTransferService/ReadKV":  {Worker},
		"/cacheblend.v1.KVTransferServiceX/ReadKV": {Engine},
		"malformed": {Engine},
	} {
		if got := p.Allowed(method); !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", method, got, want)
		}
	}
	// Each call returns a policy of its own.
	q := WorkerPolicy()
	q.Services[KVTransferService][0] = Blend
	q.Default[0] = Blend
	if got := WorkerPolicy().Allowed("/" + KVTransferService + "/ReadKV"); !slices.Equal(got, []Role{Worker}) {
		t.Errorf("policy shared: %v", got)
	}
	if !slices.Equal(WorkerCallers, []Role{Engine}) || !slices.Equal(KVTransferCallers, []Role{Worker}) {
		t.Errorf("WorkerCallers %v, KVTransferCallers %v changed", WorkerCallers, KVTransferCallers)
	}
}

package engine

import (
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cacheblend/cacheblend/engine/api"
	"github.com/cacheblend/cacheblend/httpfront"
	"github.com/cacheblend/cacheblend/metrics"
)

// statusWriter is the API writer (httpfront.StatusWriter).
type statusWriter = httpfront.StatusWriter

// writeJSON writes a JSON body (httpfront.WriteJSON).
var writeJSON = httpfront.WriteJSON

// newFront builds the engine's HTTP front: its routes, API key, body bounds and server.
func (e *Engine) newFront() *httpfront.Front {
	return httpfront.New(httpfront.Config{
		Component: "engine", Addr: e.cfg.Addr, Settings: e.cfg.Settings, Logger: e.log,
	}, httpfront.Handlers{
		Generate: e.serveGenerate, Documents: e.serveDocuments, Models: e.serveModels, Health: e.serveHealth,
		Metrics: metrics.Handler(e.gatherer, e.refreshMetrics), Record: e.metrics.RecordHTTP,
	})
}

func (e *Engine) serveModels(w *statusWriter, r *http.Request, route string, _ time.Time) {
	w.Header().Set(api.HeaderRequestID, api.NewRequestID())
	if apiErr := e.front.Authorize(r); apiErr != nil {
		apiErr.Write(w)
		return
	}
	m := api.Model{ID: e.cfg.Model, Object: "model", Created: e.modelCreated(), OwnedBy: "cacheblend"}
	if info, ok := e.sched.WorkerInfo(); ok {
		m.MaxModelLen = int(info.GetMaxPositions())
	}
	if route == api.RouteModel {
		if id := strings.TrimPrefix(r.URL.Path, api.RouteModels+"/"); id != e.cfg.Model {
			api.ModelNotFound(id).Write(w)
			return
		}
		writeJSON(w, http.StatusOK, m)
		return
	}
	writeJSON(w, http.StatusOK, api.ModelList{Object: "list", Data: []api.Model{m}})
}

func (e *Engine) serveHealth(w *statusWriter, _ *http.Request, _ string, _ time.Time) {
	w.Header().Set(api.HeaderRequestID, api.NewRequestID())
	_, ready := e.sched.WorkerInfo()
	down := e.front.ShuttingDown()
	switch {
	case down:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": "shutting down", "role": e.cfg.Role})
	case !ready:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": "worker unavailable", "role": e.cfg.Role})
	default:
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "role": e.cfg.Role})
	}
}

// modelCreated is the "created" of the served model in /v1/models, stable
// across restarts: the model file's modification time (when the file was
// made or replaced: a new file is a new model), else — the built-in model,
// whose weights come with the binary — the build's time (buildTime); the
// engine's start time only when neither can be read.
func (e *Engine) modelCreated() int64 {
	if e.file != nil && e.file.Path != "" {
		if st, err := os.Stat(e.file.Path); err == nil {
			return st.ModTime().Unix()
		}
	}
	if t := buildTime(); t > 0 {
		return t
	}
	return e.created
}

// build is what the binary knows about its build: an id (the main
// module's version and VCS revision, with the executable's size and
// modification time when the tree was modified or the VCS is unknown) and
// a time (the VCS commit time, else the executable's modification time; 0
// when neither is known). Read once.
var build = sync.OnceValues(func() (id string, at int64) {
	var parts []string
	dirty := true
	if bi, ok := debug.ReadBuildInfo(); ok {
		parts = append(parts, bi.GoVersion, bi.Main.Path, bi.Main.Version)
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				parts = append(parts, s.Value)
				dirty = false
			case "vcs.time":
				if t, err := time.Parse(time.RFC3339, s.Value); err == nil {
					at = t.Unix()
				}
			}
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.modified" && s.Value == "true" {
				dirty = true
			}
		}
	}
	var exeTime int64
	if exe, err := os.Executable(); err == nil {
		if st, err := os.Stat(exe); err == nil {
			exeTime = st.ModTime().Unix()
			if dirty {
				parts = append(parts, strconv.FormatInt(st.Size(), 10), strconv.FormatInt(st.ModTime().UnixNano(), 10))
			}
		}
	}
	if at == 0 || dirty {
		at = exeTime
	}
	return strings.Join(parts, " "), at
})

// buildID is the engine's build identity (see build).
func buildID() string { id, _ := build(); return id }

// buildTime is the engine's build time in Unix seconds (see build).
func buildTime() int64 { _, at := build(); return at }

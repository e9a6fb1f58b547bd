package rankgroup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// RankLabel is the label every rank-labelled series carries: the rank that
// recorded it, "0".."N-1" (docs/design.md §11).
const RankLabel = "rank"

// Limits of one scrape of a rank's /metrics by rank 0.
const (
	rankScrapeTimeout = 2 * time.Second
	rankScrapeMaxBody = 32 << 20
)

// MetricsListener is a rank process's /metrics listener, inherited from rank
// 0 as descriptor MetricsFD.
func MetricsListener() (net.Listener, error) {
	f := os.NewFile(MetricsFD, "rank-metrics")
	if f == nil {
		return nil, errors.New("rankgroup: metrics listener (descriptor 5) not inherited")
	}
	defer f.Close()
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("rankgroup: metrics listener: %w", err)
	}
	return ln, nil
}

// RankRegisterer wraps reg so that every series registered through it
// carries RankLabel=rank: a rank process's worker metrics, whose values
// differ by rank.
func RankRegisterer(reg prometheus.Registerer, rank int) prometheus.Registerer {
	return prometheus.WrapRegistererWith(prometheus.Labels{RankLabel: fmt.Sprint(rank)}, reg)
}

// Gatherer gathers the rank-labelled series of ranks 1..N-1 from their
// /metrics (protobuf, so exemplars are kept), for rank 0 to expose next to
// its own: one scrape target shows the whole group, rank by rank. Families
// without the rank label (each process's Go runtime and process series) are
// left out. A rank that does not answer within 2 s, or answers more than
// 32 MiB, is an error naming it; the other ranks' series are still returned
// (prometheus.Gatherers semantics). Safe for concurrent use.
func (g *Group) Gatherer() prometheus.Gatherer {
	client := &http.Client{Timeout: rankScrapeTimeout}
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		var out []*dto.MetricFamily
		var errs []error
		for _, p := range g.ranks {
			mfs, err := scrapeRank(client, p.metricsAddr)
			if err != nil {
				errs = append(errs, fmt.Errorf("rankgroup: rank %d metrics: %w", p.rank, err))
			}
			out = append(out, mfs...)
		}
		return out, errors.Join(errs...)
	})
}

// MetricsAddrs are the /metrics addresses of ranks 1..N-1, in rank order.
func (g *Group) MetricsAddrs() []string {
	addrs := make([]string, len(g.ranks))
	for i, p := range g.ranks {
		addrs[i] = p.metricsAddr
	}
	return addrs
}

func scrapeRank(client *http.Client, addr string) ([]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(context.Background(), rankScrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	format := expfmt.NewFormat(expfmt.TypeProtoDelim)
	req.Header.Set("Accept", string(format))
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	if got := expfmt.ResponseFormat(resp.Header); got.FormatType() != expfmt.TypeProtoDelim {
		return nil, fmt.Errorf("content type %q, want %s", resp.Header.Get("Content-Type"), format)
	}
	body := &io.LimitedReader{R: resp.Body, N: rankScrapeMaxBody + 1}
	dec := expfmt.NewDecoder(body, format)
	var out []*dto.MetricFamily
	for {
		mf := &dto.MetricFamily{}
		if err := dec.Decode(mf); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return out, fmt.Errorf("decode: %w", err)
		}
		if body.N <= 0 {
			return out, fmt.Errorf("more than %d bytes", rankScrapeMaxBody)
		}
		if rankLabelled(mf) {
			out = append(out, mf)
		}
	}
	return out, nil
}

// rankLabelled reports whether mf has series and every one of them carries RankLabel.
func rankLabelled(mf *dto.MetricFamily) bool {
	hasRank := func(m *dto.Metric) bool {
		return slices.ContainsFunc(m.GetLabel(), func(lp *dto.LabelPair) bool { return lp.GetName() == RankLabel })
	}
	return len(mf.GetMetric()) > 0 && !slices.ContainsFunc(mf.GetMetric(), func(m *dto.Metric) bool { return !hasRank(m) })
}

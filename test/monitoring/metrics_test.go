package monitoring

import (
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/controller"
	"github.com/outbox-dev/outbox-operator/internal/doctor"
	"github.com/outbox-dev/outbox-operator/internal/relay"
)

// repoRoot is the repository, seen from this package's directory.
var repoRoot = filepath.Join("..", "..")

// descName reads the metric name out of a Desc (it has no accessor).
var descName = regexp.MustCompile(`fqName: "([^"]+)"`)

// exported returns the name of every series the project exports: the
// relay's collectors (relay.Metrics, the Redis check gauge of
// internal/doctor) and the manager's per-relay gauges
// (controller.RelayMetrics), as their registries describe them. A
// histogram's name stands for its _bucket, _sum and _count series.
func exported(t testing.TB) map[string]bool {
	t.Helper()
	var relayCollectors recorder
	require.NoError(t, relay.NewMetrics().Register(&relayCollectors))
	collectors := slices.Concat(relayCollectors, recorder{doctor.NewGauge(), controller.NewRelayMetrics()})

	names := map[string]bool{}
	ch := make(chan *prometheus.Desc)
	go func() {
		defer close(ch)
		for _, c := range collectors {
			c.Describe(ch)
		}
	}()
	for d := range ch {
		m := descName.FindStringSubmatch(d.String())
		require.NotNil(t, m, "cannot read the name of %s", d)
		names[m[1]] = true
	}
	// A histogram (gathered: the relay's have no labels) exports three series.
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(relayCollectors))
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				names[f.GetName()+suffix] = true
			}
		}
	}
	require.Contains(t, names, "outbox_relay_events_published_total")
	require.Contains(t, names, "outbox_operator_relay_backlog")
	return names
}

// recorder is a Registerer that keeps the collectors; as a Collector it
// describes them all.
type recorder []prometheus.Collector

func (r *recorder) Register(c prometheus.Collector) error   { *r = append(*r, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { *r = append(*r, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return false }
func (r recorder) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range r {
		c.Describe(ch)
	}
}
func (r recorder) Collect(ch chan<- prometheus.Metric) {
	for _, c := range r {
		c.Collect(ch)
	}
}

// grafanaVariables are what Grafana substitutes before it sends a query.
var grafanaVariables = strings.NewReplacer(
	"$__rate_interval", "5m", "$__interval", "1m", "$__range", "6h",
	"${namespace}", "shop", "${relay}", "orders", "$namespace", "shop", "$relay", "orders",
)

// metricNames parses a PromQL expression and returns every metric it names.
func metricNames(t testing.TB, expr string) []string {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVariables.Replace(expr))
	require.NoError(t, err, "%s", expr)
	var names []string
	parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
		if vs, ok := node.(*parser.VectorSelector); ok {
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
					name = m.Value
				}
			}
			require.NotEmpty(t, name, "a selector without a metric name in %s", expr)
			names = append(names, name)
		}
		return nil
	})
	return names
}

// A sanity check of the checker itself.
func TestMetricNames(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"a_bucket", "b"},
		metricNames(t, `histogram_quantile(0.9, sum by (le) (rate(a_bucket{x=~"$namespace"}[$__rate_interval]))) / on() b`))
}

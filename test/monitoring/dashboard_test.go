package monitoring

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
)

// dashboardPath is the dashboard; the chart holds a copy (make manifests).
var dashboardPath = filepath.Join(repoRoot, "config", "grafana", "outbox-operator.json")

type dashboard struct {
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	Title   string  `json:"title"`
	Type    string  `json:"type"`
	Panels  []panel `json:"panels"` // a collapsed row's
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

// labelValues is a Grafana variable's query: label_values(<selector>, label).
var labelValues = regexp.MustCompile(`^label_values\((.+), *[a-z_]+\)$`)

// Every query of every panel parses, and names only metrics the project
// exports; so do the variables' queries.
func TestDashboardQueriesNameExportedMetrics(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(dashboardPath)
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(data, &d))
	require.Equal(t, "outbox-operator", d.UID)
	known := exported(t)

	var queries int
	var walk func([]panel)
	walk = func(panels []panel) {
		for _, p := range panels {
			walk(p.Panels)
			if p.Type != "row" {
				require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
			}
			for _, target := range p.Targets {
				queries++
				for _, name := range metricNames(t, target.Expr) {
					require.True(t, known[name], "panel %q: %s is not a metric the project exports (%s)", p.Title, name, target.Expr)
				}
			}
		}
	}
	walk(d.Panels)
	require.GreaterOrEqual(t, queries, 15)

	for _, v := range d.Templating.List {
		if v.Definition == "" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		require.NotNil(t, m, "variable %s: %s", v.Name, v.Definition)
		for _, name := range metricNames(t, m[1]) {
			require.True(t, known[name], "variable %s: %s is not exported", v.Name, name)
		}
	}
}

// The dashboard covers what the issue asked for: backlog and age, events/s,
// lag quantiles, batch duration, errors by kind, dead letters, replicas,
// Redis checks.
func TestDashboardCoversTheRelays(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(dashboardPath)
	require.NoError(t, err)
	for _, name := range []string{
		"outbox_operator_relay_backlog", "outbox_operator_relay_oldest_pending_age_seconds",
		"outbox_relay_events_published_total", "outbox_relay_lag_seconds_bucket",
		"outbox_relay_batch_duration_seconds_bucket", "outbox_relay_errors_total",
		"outbox_operator_relay_dead_letters", "outbox_operator_relay_ready_replicas", "outbox_relay_redis_check",
	} {
		require.Contains(t, string(data), name)
	}
}

// The chart's copy is the dashboard (make manifests copies it).
func TestChartDashboardIsCurrent(t *testing.T) {
	t.Parallel()
	want, err := os.ReadFile(dashboardPath)
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(repoRoot, "charts", "outbox-operator", "files", "dashboard.json"))
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), "charts/outbox-operator/files/dashboard.json is stale: run `make manifests`")
}

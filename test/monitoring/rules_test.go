package monitoring

import (
	"bytes"
	"context"
	"go/ast"
	goparser "go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

// runbooks is where every runbook_url points.
const runbooks = "https://github.com/outbox-dev/outbox-operator/blob/main/docs/operations.md#"

var prometheusDir = filepath.Join(repoRoot, "config", "prometheus")

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	} `json:"groups"`
}

type rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// alerts reads config/prometheus/alerts.yaml.
func alerts(t testing.TB) []rule {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(prometheusDir, "alerts.yaml"))
	require.NoError(t, err)
	var f ruleFile
	require.NoError(t, yaml.UnmarshalStrict(data, &f))
	var out []rule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	require.NotEmpty(t, out)
	return out
}

// missing skips the test with hint, or fails it when CI=true: in CI a
// missing dependency is a failure that says how to get it.
func missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// Each alert fires on a series that should fire it and stays silent on one
// that should not: config/prometheus/alerts_test.yaml, run by the pinned
// promtool (bin/promtool, `make promtool`).
func TestAlertsPromtool(t *testing.T) {
	t.Parallel()
	promtool := os.Getenv("PROMTOOL")
	if promtool == "" {
		promtool = filepath.Join(repoRoot, "bin", "promtool")
	}
	if _, err := os.Stat(promtool); err != nil {
		missing(t, "%s is missing (%v): run `make promtool` (`make test` does it first)", promtool, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, args := range [][]string{{"check", "rules", "alerts.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.CommandContext(ctx, promtool, args...)
		cmd.Dir = prometheusDir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	}
}

// Every alert has a case that fires it and one where it stays silent.
func TestEveryAlertIsTested(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join(prometheusDir, "alerts_test.yaml"))
	require.NoError(t, err)
	var f struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `json:"alertname"`
				ExpAlerts []map[string]any `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	require.NoError(t, yaml.Unmarshal(data, &f))
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, test := range f.Tests {
		for _, c := range test.AlertRuleTest {
			if len(c.ExpAlerts) > 0 {
				fires[c.Alertname] = true
			} else {
				silent[c.Alertname] = true
			}
		}
	}
	for _, a := range alerts(t) {
		require.True(t, fires[a.Alert], "no case of alerts_test.yaml fires %s", a.Alert)
		require.True(t, silent[a.Alert], "no case of alerts_test.yaml keeps %s silent", a.Alert)
	}
}

// The alerts name only metrics the project exports, and say what to do.
func TestAlertsNameExportedMetrics(t *testing.T) {
	t.Parallel()
	known := exported(t)
	for _, a := range alerts(t) {
		require.NotEmpty(t, a.Alert, "only alerts in alerts.yaml")
		for _, name := range metricNames(t, a.Expr) {
			require.True(t, known[name], "alert %s: %s is not a metric the project exports", a.Alert, name)
		}
		require.Contains(t, []string{"critical", "warning"}, a.Labels["severity"], a.Alert)
		require.NotEmpty(t, a.Annotations["summary"], a.Alert)
		require.NotEmpty(t, a.Annotations["description"], a.Alert)
	}
}

// From an alert to the runbook entry that resolves it: every runbook_url is
// an anchor of docs/operations.md, and OutboxRelayNotReady's (the Ready
// condition's reason, lowercased) exists for every reason that says
// something is wrong.
func TestAlertsLinkRunbookEntries(t *testing.T) {
	t.Parallel()
	anchors := operationsAnchors(t)
	for _, a := range alerts(t) {
		url := a.Annotations["runbook_url"]
		require.True(t, strings.HasPrefix(url, runbooks), "alert %s: runbook_url %q is not in docs/operations.md", a.Alert, url)
		anchor := strings.TrimPrefix(url, runbooks)
		if anchor == "{{ $labels.reason | toLower }}" {
			for _, reason := range reasons(t) {
				if v1alpha1.Reason(reason).IsFailure() {
					require.True(t, anchors[strings.ToLower(reason)],
						"alert %s links #%s (reason %s): docs/operations.md needs a heading %q", a.Alert, strings.ToLower(reason), reason, reason)
				}
			}
			continue
		}
		require.True(t, anchors[anchor], "alert %s: docs/operations.md has no heading with the anchor #%s", a.Alert, anchor)
	}
}

// operationsAnchors returns the anchors GitHub makes of docs/operations.md's
// headings: lowercase, punctuation but - and _ dropped, spaces as -.
func operationsAnchors(t testing.TB) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "docs", "operations.md"))
	require.NoError(t, err)
	drop := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	anchors := map[string]bool{}
	inCode := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		heading := strings.TrimSpace(strings.TrimLeft(line, "#"))
		anchor := strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(heading), ""), " ", "-")
		anchors[anchor] = true
	}
	return anchors
}

// reasons reads the values of the Reason constants of api/v1alpha1.
func reasons(t testing.TB) []string {
	t.Helper()
	f, err := goparser.ParseFile(token.NewFileSet(), filepath.Join(repoRoot, "api", "v1alpha1", "conditions.go"), nil, 0)
	require.NoError(t, err)
	var out []string
	for _, decl := range f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			v := spec.(*ast.ValueSpec)
			if id, ok := v.Type.(*ast.Ident); !ok || id.Name != "Reason" {
				continue
			}
			for _, value := range v.Values {
				lit, ok := value.(*ast.BasicLit)
				require.True(t, ok, "a Reason constant that is not a string literal")
				s, err := strconv.Unquote(lit.Value)
				require.NoError(t, err)
				out = append(out, s)
			}
		}
	}
	require.Contains(t, out, string(v1alpha1.ReasonSecretNotFound))
	return out
}

// The chart's copy and the PrometheusRule of config/prometheus are
// alerts.yaml (make manifests writes them).
func TestAlertCopiesAreCurrent(t *testing.T) {
	t.Parallel()
	want, err := os.ReadFile(filepath.Join(prometheusDir, "alerts.yaml"))
	require.NoError(t, err)
	want = want[bytes.Index(want, []byte("\ngroups:"))+1:]

	chart, err := os.ReadFile(filepath.Join(repoRoot, "charts", "outbox-operator", "files", "alerts.yaml"))
	require.NoError(t, err)
	_, body, _ := bytes.Cut(chart, []byte("\n"))
	require.Equal(t, string(want), string(body), "charts/outbox-operator/files/alerts.yaml is stale: run `make manifests`")

	data, err := os.ReadFile(filepath.Join(prometheusDir, "prometheus_rule.yaml"))
	require.NoError(t, err)
	var pr struct {
		Kind string   `json:"kind"`
		Spec ruleFile `json:"spec"`
	}
	require.NoError(t, yaml.Unmarshal(data, &pr))
	require.Equal(t, "PrometheusRule", pr.Kind)
	var plain ruleFile
	require.NoError(t, yaml.UnmarshalStrict(want, &plain))
	require.Equal(t, plain, pr.Spec, "config/prometheus/prometheus_rule.yaml is stale: run `make manifests`")
}

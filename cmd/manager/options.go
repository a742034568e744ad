package main

import (
	"cmp"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/internal/backlog"
	"github.com/outbox-dev/outbox-operator/internal/controller"
)

// leaderElectionID names the Lease the replicas of the manager compete for.
const leaderElectionID = "outbox-operator.relay.outbox.dev"

// defaultImageRepository is where the operator's image is published; the
// default relay image is this repository at the manager's version.
const defaultImageRepository = "ghcr.io/outbox-dev/outbox-operator"

// options are the manager's settings, from flags and environment.
type options struct {
	kubeconfig              string
	metricsAddr             string
	metricsSecure           bool
	metricsCertDir          string
	enableHTTP2             bool
	probeAddr               string
	leaderElect             bool
	leaderElectionNamespace string
	relayImage              string
	watchNamespaces         []string
	maxConcurrentReconciles int
	checks                  backlog.Config
	pools                   backlog.PoolMeasurerConfig
	logLevel                string
	logFormat               string
}

// parseFlags reads the flags; getenv supplies the image defaults.
func parseFlags(args []string, getenv func(string) string) (options, error) {
	var o options
	var namespaces string
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "",
		"Path to a kubeconfig; empty means $KUBECONFIG, else the in-cluster config, else ~/.kube/config.")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8443",
		"Address of the Prometheus /metrics endpoint; 0 disables it.")
	fs.BoolVar(&o.metricsSecure, "metrics-secure", true,
		"Serve /metrics over HTTPS to clients the API server authenticates (TokenReview) and authorizes "+
			"(SubjectAccessReview: get on the non-resource URL /metrics, as the metrics-reader ClusterRole grants); "+
			"false serves plain HTTP to anyone.")
	fs.StringVar(&o.metricsCertDir, "metrics-cert-dir", "",
		"Directory with tls.crt and tls.key for the metrics endpoint (reloaded when they change); "+
			"empty: a self-signed certificate generated at start.")
	fs.BoolVar(&o.enableHTTP2, "enable-http2", false,
		"Serve the metrics endpoint over HTTP/2 as well; off because of the HTTP/2 Stream Cancellation "+
			"and Rapid Reset vulnerabilities (CVE-2023-44487, CVE-2023-39325).")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081",
		"Address of the /healthz and /readyz endpoints.")
	fs.BoolVar(&o.leaderElect, "leader-elect", false,
		"Elect a leader among the manager's replicas (a Lease), so only one reconciles.")
	fs.StringVar(&o.leaderElectionNamespace, "leader-election-namespace", "",
		"Namespace of the leader-election Lease; empty means the manager's own namespace (required outside a cluster).")
	fs.StringVar(&o.relayImage, "relay-image", defaultRelayImage(getenv),
		"Image of the relay and cleanup pods when an OutboxRelay names none; defaults to $RELAY_IMAGE, else the "+
			"operator's own image ($OPERATOR_IMAGE), else "+defaultImageRepository+":<version>.")
	fs.StringVar(&namespaces, "watch-namespaces", "",
		"Comma-separated namespaces to reconcile OutboxRelays in; empty means all.")
	fs.IntVar(&o.maxConcurrentReconciles, "max-concurrent-reconciles", 8,
		"Number of OutboxRelays reconciled at the same time.")
	fs.DurationVar(&o.checks.Timeout, "backlog-check-timeout", 10*time.Second,
		"Deadline of the queries of one backlog check, from when it holds a check slot; connecting has its own deadline.")
	fs.DurationVar(&o.checks.ConnectTimeout, "backlog-connect-timeout", 5*time.Second,
		"Deadline of getting the PostgreSQL connection of a backlog check (a free connection slot, dialling, TLS, login).")
	fs.DurationVar(&o.checks.FirstConnectTimeout, "backlog-first-connect-timeout", time.Second,
		"Deadline of the connection of a backlog check until one to that database has been made, doubling with each "+
			"check that could not connect, up to --backlog-connect-timeout: a database that never answers holds a dial "+
			"slot this long, not the full timeout.")
	var maxConns int
	fs.IntVar(&maxConns, "backlog-max-conns", 2,
		"Most connections of one backlog pool (one pool per namespace and DSN).")
	fs.DurationVar(&o.pools.StatementTimeout, "backlog-statement-timeout", 5*time.Second,
		"PostgreSQL statement_timeout of the backlog query.")
	fs.IntVar(&o.checks.MaxConcurrentChecks, "backlog-max-concurrent-checks", 16,
		"Most backlog checks that run their queries at once, across every OutboxRelay; a check takes a slot once it has a connection.")
	fs.IntVar(&o.checks.MaxConcurrentDials, "backlog-max-concurrent-dials", 0,
		"Most backlog checks that get a PostgreSQL connection at once (so the dials in flight), across every OutboxRelay; "+
			"a due check is queued for one, and holds it until it has a connection and a check slot. "+
			"0: half of --backlog-max-open-conns.")
	fs.IntVar(&o.pools.MaxOpenConns, "backlog-max-open-conns", 64,
		"Most PostgreSQL connections the backlog checks hold open at once, across every pool; idle ones are closed to make room.")
	fs.Int64Var(&o.pools.CountLimit, "backlog-count-limit", 1_000_000,
		"Pending rows counted at most per check; a larger backlog is reported as this number with status.backlogCapped.")
	fs.BoolVar(&o.pools.AllowFileKeys, "allow-dsn-file-keys", false,
		"Honour the DSN keys that read files of the operator's pod (service, servicefile, passfile, sslkey, sslcert, "+
			"sslrootcert, sslcrl, sslcrldir); off, such a DSN gets reason DSNKeyNotAllowed and its backlog is not measured.")
	fs.StringVar(&o.logLevel, "log-level", "info", "Log level: debug, info, warn or error.")
	fs.StringVar(&o.logFormat, "log-format", "json", "Log format: json or text.")
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if o.maxConcurrentReconciles < 1 {
		return options{}, errors.New("--max-concurrent-reconciles must be at least 1")
	}
	for _, d := range []struct {
		name  string
		value time.Duration
	}{
		{"--backlog-check-timeout", o.checks.Timeout},
		{"--backlog-connect-timeout", o.checks.ConnectTimeout},
		{"--backlog-first-connect-timeout", o.checks.FirstConnectTimeout},
	} {
		if d.value <= 0 {
			return options{}, fmt.Errorf("%s must be positive", d.name)
		}
	}
	if o.checks.FirstConnectTimeout > o.checks.ConnectTimeout {
		return options{}, errors.New("--backlog-first-connect-timeout must not exceed --backlog-connect-timeout")
	}
	if maxConns < 1 {
		return options{}, errors.New("--backlog-max-conns must be at least 1")
	}
	if o.checks.MaxConcurrentChecks < 1 {
		return options{}, errors.New("--backlog-max-concurrent-checks must be at least 1")
	}
	if o.checks.MaxConcurrentDials < 0 {
		return options{}, errors.New("--backlog-max-concurrent-dials must not be negative")
	}
	if o.pools.MaxOpenConns < 1 {
		return options{}, errors.New("--backlog-max-open-conns must be at least 1")
	}
	if o.checks.MaxConcurrentDials == 0 {
		// The other half is for the connections the checks measure over
		// and the idle ones kept for the next checks.
		o.checks.MaxConcurrentDials = max(1, o.pools.MaxOpenConns/2)
	}
	if o.checks.MaxConcurrentDials > o.pools.MaxOpenConns {
		// More would wait for a connection slot within their connect
		// timeout, and fail for the operator's own bound.
		return options{}, errors.New("--backlog-max-concurrent-dials must not exceed --backlog-max-open-conns")
	}
	if o.pools.CountLimit < 1 {
		return options{}, errors.New("--backlog-count-limit must be at least 1")
	}
	o.pools.MaxConns = int32(min(maxConns, 1000))
	if o.relayImage == "" {
		return options{}, errors.New("--relay-image must not be empty")
	}
	for _, ns := range strings.Split(namespaces, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			o.watchNamespaces = append(o.watchNamespaces, ns)
		}
	}
	return o, nil
}

// defaultRelayImage is $RELAY_IMAGE, else the operator's own image
// ($OPERATOR_IMAGE, set by the Deployment from its own image), else the
// published image of this version.
func defaultRelayImage(getenv func(string) string) string {
	return cmp.Or(getenv("RELAY_IMAGE"), getenv("OPERATOR_IMAGE"), defaultImageRepository+":"+version)
}

// restConfig loads the kubeconfig of --kubeconfig, or finds one as
// ctrl.GetConfig does. Client-side throttling is off, as with
// ctrl.GetConfig: the API server's priority and fairness protects it.
func restConfig(o options) (*rest.Config, error) {
	if o.kubeconfig == "" {
		return ctrl.GetConfig()
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return nil, err
	}
	if cfg.QPS == 0 {
		cfg.QPS = -1
	}
	return cfg, nil
}

// newScheme knows the built-in kinds and the OutboxRelay.
func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1alpha1.AddToScheme(s))
	return s
}

// managerOptions builds the manager's options; the cache and client
// settings are the controller's (controller.CacheOptions).
func managerOptions(o options) ctrl.Options {
	return ctrl.Options{
		Scheme:                        newScheme(),
		Cache:                         controller.CacheOptions(o.watchNamespaces),
		Client:                        controller.ClientOptions(),
		Metrics:                       metricsOptions(o),
		HealthProbeBindAddress:        o.probeAddr,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              leaderElectionID,
		LeaderElectionNamespace:       o.leaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
	}
}

// metricsOptions serves /metrics as kubebuilder v4 scaffolds it: HTTPS, each
// request authenticated and authorized by the API server, HTTP/1.1 only
// unless --enable-http2.
func metricsOptions(o options) metricsserver.Options {
	m := metricsserver.Options{BindAddress: o.metricsAddr, SecureServing: o.metricsSecure}
	if !o.metricsSecure {
		return m
	}
	m.FilterProvider = filters.WithAuthenticationAndAuthorization
	m.CertDir = o.metricsCertDir
	if !o.enableHTTP2 {
		m.TLSOpts = append(m.TLSOpts, disableHTTP2)
	}
	return m
}

// disableHTTP2 offers only HTTP/1.1 in the TLS handshake.
func disableHTTP2(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }

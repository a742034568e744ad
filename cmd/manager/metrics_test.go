package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/internal/controller"
)

// The manager's /metrics, as the installer configures it (the default
// flags), against a real kube-apiserver: HTTPS, a scrape without a token is
// refused, one by an identity without the metrics-reader ClusterRole is
// forbidden, one bound to it (config/rbac/metrics_reader_role.yaml) gets
// the metrics; HTTP/2 is not offered. The manager itself runs with only
// config/rbac/metrics_auth_role.yaml, which its checks need.
func TestMetricsEndpointRequiresAuthorization(t *testing.T) {
	testenv.RequireEnvtestAssets(t)
	testEnv := &envtest.Environment{}
	admin, err := testEnv.Start()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, testEnv.Stop()) })
	cs, err := kubernetes.NewForConfig(admin)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const ns = "outbox-system"
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	managerToken := serviceAccountToken(ctx, t, cs, ns, "manager")
	bindClusterRole(ctx, t, cs, "metrics_auth_role.yaml", ns, "manager")
	readerToken := serviceAccountToken(ctx, t, cs, ns, "prometheus")
	bindClusterRole(ctx, t, cs, "metrics_reader_role.yaml", ns, "prometheus")
	strangerToken := serviceAccountToken(ctx, t, cs, ns, "stranger")

	// The manager, as the ServiceAccount "manager", with the default
	// metrics flags on a free port.
	addr := freeAddr(t)
	o, err := parseFlags([]string{"--metrics-bind-address=" + addr, "--health-probe-bind-address=0"}, env(nil))
	require.NoError(t, err)
	require.True(t, o.metricsSecure, "secure by default")
	require.False(t, o.enableHTTP2, "HTTP/2 off by default")
	cfg := rest.AnonymousClientConfig(admin)
	cfg.BearerToken = managerToken
	ctrl.SetLogger(logr.Discard())
	mgr, err := ctrl.NewManager(cfg, managerOptions(o))
	require.NoError(t, err)
	relays := controller.NewRelayMetrics()
	require.NoError(t, metrics.Registry.Register(relays))
	t.Cleanup(func() { metrics.Registry.Unregister(relays) })
	relays.Set(types.NamespacedName{Namespace: "shop", Name: "orders"}, v1alpha1.OutboxRelayStatus{Backlog: ptr.To[int64](7)})
	mctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		// The manager's certificate is self-signed (--metrics-cert-dir unset).
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a test of a self-signed endpoint
		ForceAttemptHTTP2: true,
	}}
	scrape := func(token string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics", nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		var resp *http.Response
		require.Eventually(t, func() bool {
			resp, err = client.Do(req) //nolint:bodyclose // closed below
			return err == nil
		}, 30*time.Second, 100*time.Millisecond, "the metrics endpoint never answered: %v", err)
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, string(body)
	}

	resp, _ := scrape("")
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "no token")
	require.Equal(t, "HTTP/1.1", resp.Proto, "HTTP/2 is off")

	// controller-runtime answers 500 "Authentication failed" when the
	// TokenReview rejects the token with an error, 401 when it has none.
	resp, body := scrape("not-a-token")
	require.Contains(t, []int{http.StatusUnauthorized, http.StatusInternalServerError}, resp.StatusCode,
		"a token the API server does not know: %s", body)
	require.NotContains(t, body, "outbox_operator")

	resp, _ = scrape(strangerToken)
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "a ServiceAccount without the metrics-reader role")

	resp, body = scrape(readerToken)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	require.Contains(t, body, `outbox_operator_relay_backlog{name="orders",namespace="shop"} 7`)
}

// serviceAccountToken creates the ServiceAccount and returns a token of it.
func serviceAccountToken(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name string) string {
	t.Helper()
	_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	require.NoError(t, err)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}},
		metav1.CreateOptions{})
	require.NoError(t, err)
	return tr.Status.Token
}

// bindClusterRole creates the ClusterRole of config/rbac/<file> and binds
// it to the ServiceAccount.
func bindClusterRole(ctx context.Context, t *testing.T, cs kubernetes.Interface, file, ns, sa string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", file))
	require.NoError(t, err)
	var role rbacv1.ClusterRole
	require.NoError(t, yaml.UnmarshalStrict(data, &role))
	_, err = cs.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s", role.Name, sa)},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// freeAddr returns a loopback address with a port that was free.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

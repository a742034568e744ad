package podspec

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// fakeSources holds the objects env may reference.
type fakeSources struct {
	secrets    map[string]*corev1.Secret
	configMaps map[string]*corev1.ConfigMap
	services   []*corev1.Service
}

func (f fakeSources) Secret(ns, name string) (*corev1.Secret, error) {
	if s, ok := f.secrets[ns+"/"+name]; ok {
		return s, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
}

func (f fakeSources) ConfigMap(ns, name string) (*corev1.ConfigMap, error) {
	if c, ok := f.configMaps[ns+"/"+name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, name)
}

func (f fakeSources) Services(string) ([]*corev1.Service, error) { return f.services, nil }

func testSources() fakeSources {
	return fakeSources{
		secrets: map[string]*corev1.Secret{
			"shop/db": {Data: map[string][]byte{"dsn": []byte("postgres://db:5432/app")}},
		},
		configMaps: map[string]*corev1.ConfigMap{
			"shop/cfg": {Data: map[string]string{"STREAM": "jobs", "LEVEL": "debug"}},
		},
		services: []*corev1.Service{
			{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default"},
				Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1",
					Ports: []corev1.ServicePort{{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP}}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "orders-api", Namespace: "shop"},
				Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.20",
					Ports: []corev1.ServicePort{{Name: "http", Port: 8080, Protocol: corev1.ProtocolTCP}}}},
		},
	}
}

func testPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "worker-abc", Namespace: "shop", UID: "1234-5678",
			Labels: map[string]string{"app": "worker"}, Annotations: map[string]string{"note": "x"}},
		Spec: corev1.PodSpec{NodeName: "local-node", ServiceAccountName: "worker",
			Containers: []corev1.Container{{Name: "worker", Image: "ghcr.io/outbox-dev/outbox-operator:dev"}}},
	}
}

func envMap(env []EnvVar) map[string]string {
	m := map[string]string{}
	for _, e := range env {
		m[e.Name] = e.Value
	}
	return m
}

func TestEnvResolvesEveryKindOfSourceInOrder(t *testing.T) {
	t.Parallel()
	pod := testPod()
	c := &pod.Spec.Containers[0]
	c.EnvFrom = []corev1.EnvFromSource{{Prefix: "CFG_",
		ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}}
	c.Env = []corev1.EnvVar{
		{Name: "DATABASE_URL", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "db"}, Key: "dsn"}}},
		{Name: "STREAM", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, Key: "STREAM"}}},
		{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: "APP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
		{Name: "GREETING", Value: "hello $(POD_NAME) on $(POD_IP), $$(POD_NAME) stays, $(UNDEFINED) too"},
		{Name: "CONSUMER", Value: "$(CFG_STREAM)-$(POD_NAME)"},
		{Name: "STREAM", Value: "override"},
	}
	env, err := Env(pod, c, testSources(), Runtime{PodIP: "10.244.0.7", HostIP: "127.0.0.1"})
	require.NoError(t, err)
	m := envMap(env)
	require.Equal(t, "postgres://db:5432/app", m["DATABASE_URL"])
	require.Equal(t, "override", m["STREAM"], "a later env entry wins")
	require.Equal(t, "worker-abc", m["POD_NAME"])
	require.Equal(t, "10.244.0.7", m["POD_IP"])
	require.Equal(t, "worker", m["APP"])
	require.Equal(t, "hello worker-abc on 10.244.0.7, $(POD_NAME) stays, $(UNDEFINED) too", m["GREETING"])
	require.Equal(t, "jobs-worker-abc", m["CONSUMER"])
	require.Equal(t, "debug", m["CFG_LEVEL"])
	// Service variables: the kubernetes Service and those of the pod's namespace.
	require.Equal(t, "10.96.0.1", m["KUBERNETES_SERVICE_HOST"])
	require.Equal(t, "443", m["KUBERNETES_SERVICE_PORT"])
	require.Equal(t, "10.96.0.20", m["ORDERS_API_SERVICE_HOST"])
	require.Equal(t, "tcp://10.96.0.20:8080", m["ORDERS_API_PORT_8080_TCP"])
	// Service variables come first, so env may expand them.
	require.Less(t, indexOf(env, "KUBERNETES_SERVICE_HOST"), indexOf(env, "DATABASE_URL"))
}

func indexOf(env []EnvVar, name string) int {
	for i, e := range env {
		if e.Name == name {
			return i
		}
	}
	return -1
}

func TestEnvServiceLinksOff(t *testing.T) {
	t.Parallel()
	pod := testPod()
	pod.Spec.EnableServiceLinks = new(false)
	env, err := Env(pod, &pod.Spec.Containers[0], testSources(), Runtime{})
	require.NoError(t, err)
	m := envMap(env)
	require.Contains(t, m, "KUBERNETES_SERVICE_HOST", "the kubernetes Service is always there")
	require.NotContains(t, m, "ORDERS_API_SERVICE_HOST")
}

func TestEnvMissingReferences(t *testing.T) {
	t.Parallel()
	ref := func(name, key string, opt bool) corev1.EnvVar {
		return corev1.EnvVar{Name: "X", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key, Optional: &opt}}}
	}
	for name, tc := range map[string]struct {
		env     corev1.EnvVar
		wantErr string
	}{
		"missing secret":          {ref("nope", "dsn", false), `secret "nope" not found`},
		"missing key":             {ref("db", "nope", false), "couldn't find key nope in Secret shop/db"},
		"optional missing secret": {ref("nope", "dsn", true), ""},
		"optional missing key":    {ref("db", "nope", true), ""},
		"unsupported field": {corev1.EnvVar{Name: "X", ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.bogus"}}}, `unsupported fieldRef "spec.bogus"`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pod := testPod()
			pod.Spec.Containers[0].Env = []corev1.EnvVar{tc.env}
			env, err := Env(pod, &pod.Spec.Containers[0], testSources(), Runtime{})
			if tc.wantErr == "" {
				require.NoError(t, err)
				require.NotContains(t, envMap(env), "X")
				return
			}
			var cfgErr *ConfigError
			require.ErrorAs(t, err, &cfgErr)
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestResourceFieldRef(t *testing.T) {
	t.Parallel()
	pod := testPod()
	c := &pod.Spec.Containers[0]
	c.Resources.Limits = corev1.ResourceList{
		corev1.ResourceMemory: resource.MustParse("128Mi"), corev1.ResourceCPU: resource.MustParse("250m"),
	}
	c.Env = []corev1.EnvVar{
		{Name: "MEM_MI", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{
			Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}}},
		{Name: "CPU", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.cpu"}}},
	}
	env, err := Env(pod, c, testSources(), Runtime{})
	require.NoError(t, err)
	require.Equal(t, "128", envMap(env)["MEM_MI"])
	require.Equal(t, "1", envMap(env)["CPU"], "CPU rounds up to whole cores")
}

func TestExpand(t *testing.T) {
	t.Parallel()
	lookup := MapLookup([]EnvVar{{"A", "1"}, {"B", "two"}, {"A", "3"}})
	for in, want := range map[string]string{
		"":               "",
		"plain":          "plain",
		"$(A)":           "3",
		"x$(B)y":         "xtwoy",
		"$$(A)":          "$(A)",
		"$(MISSING)":     "$(MISSING)",
		"$(A":            "$(A",
		"$A":             "$A",
		"tail$":          "tail$",
		"$()":            "$()",
		"$(A)$(B)$$$(A)": "3two$3",
	} {
		require.Equal(t, want, Expand(in, lookup), "Expand(%q)", in)
	}
}

var project = Image{
	Repository: "ghcr.io/outbox-dev/outbox-operator",
	Entrypoint: []string{"/manager"},
	Binaries:   []string{"/manager", "/relay", "/orders-api", "/worker"},
	User:       65532, Group: 65532,
}

func TestCommandMapsImageBinariesAndExpandsArgs(t *testing.T) {
	t.Parallel()
	env := []EnvVar{{"STREAM", "jobs"}, {"POD_NAME", "w-1"}}
	for name, tc := range map[string]struct {
		c        corev1.Container
		wantPath string
		wantArgs []string
		wantErr  any
	}{
		"command and args": {
			c: corev1.Container{Name: "w", Image: "ghcr.io/outbox-dev/outbox-operator:dev", Command: []string{"/worker"},
				Args: []string{"--stream=$(STREAM)", "--consumer=$(POD_NAME)", "--x=$$(STREAM)"}},
			wantPath: "/bin/dir/worker", wantArgs: []string{"--stream=jobs", "--consumer=w-1", "--x=$(STREAM)"},
		},
		"multi-word command": {
			c: corev1.Container{Name: "m", Image: "ghcr.io/outbox-dev/outbox-operator@sha256:abc",
				Command: []string{"/orders-api", "migrate"}, Args: []string{"--timeout=5m"}},
			wantPath: "/bin/dir/orders-api", wantArgs: []string{"migrate", "--timeout=5m"},
		},
		"entrypoint when no command": {
			c:        corev1.Container{Name: "m", Image: "ghcr.io/outbox-dev/outbox-operator:v1.2.3", Args: []string{"--leader-elect"}},
			wantPath: "/bin/dir/manager", wantArgs: []string{"--leader-elect"},
		},
		"unknown image": {
			c:       corev1.Container{Name: "db", Image: "postgres:16"},
			wantErr: new(*ImageError),
		},
		"registry port is not a tag": {
			c:       corev1.Container{Name: "db", Image: "localhost:5000/outbox-operator"},
			wantErr: new(*ImageError),
		},
		"binary not in image": {
			c:       corev1.Container{Name: "sh", Image: "ghcr.io/outbox-dev/outbox-operator:dev", Command: []string{"/bin/sh", "-c", "true"}},
			wantErr: new(*ConfigError),
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path, args, err := Command(&tc.c, []Image{project}, "/bin/dir", env)
			if tc.wantErr != nil {
				require.ErrorAs(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.wantPath, path)
			require.Equal(t, tc.wantArgs, args)
		})
	}
}

func TestRepository(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"ghcr.io/outbox-dev/outbox-operator:dev":        "ghcr.io/outbox-dev/outbox-operator",
		"ghcr.io/outbox-dev/outbox-operator@sha256:abc": "ghcr.io/outbox-dev/outbox-operator",
		"localhost:5000/img:1":                          "localhost:5000/img",
		"localhost:5000/img":                            "localhost:5000/img",
		"redis":                                         "redis",
	} {
		require.Equal(t, want, Repository(in), in)
	}
}

func TestRunAs(t *testing.T) {
	t.Parallel()
	pod := testPod()
	uid, gid, err := RunAs(pod, &pod.Spec.Containers[0], []Image{project})
	require.NoError(t, err)
	require.Equal(t, []int64{65532, 65532}, []int64{uid, gid}, "the image's USER")

	pod.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: new(int64(1000)), RunAsGroup: new(int64(1001)), RunAsNonRoot: new(true)}
	uid, gid, err = RunAs(pod, &pod.Spec.Containers[0], []Image{project})
	require.NoError(t, err)
	require.Equal(t, []int64{1000, 1001}, []int64{uid, gid})

	pod.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsUser: new(int64(0))}
	_, _, err = RunAs(pod, &pod.Spec.Containers[0], []Image{project})
	var cfgErr *ConfigError
	require.ErrorAs(t, err, &cfgErr, "runAsNonRoot refuses uid 0")
}

func TestProbe(t *testing.T) {
	t.Parallel()
	c := &corev1.Container{Name: "api",
		Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "probes", ContainerPort: 8081}}}
	http := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
		HTTPGet: &corev1.HTTPGetAction{Path: "readyz", Port: intstr.FromString("probes")}}, PeriodSeconds: 5}
	got, err := Probe(http, c, "10.244.0.9")
	require.NoError(t, err)
	require.Equal(t, "http", got.Kind)
	require.Equal(t, "http://10.244.0.9:8081/readyz", got.URL)
	require.Equal(t, 5*time.Second, got.Period)
	require.Equal(t, time.Second, got.Timeout)
	require.Equal(t, 3, got.FailureThreshold)
	require.Equal(t, 1, got.SuccessThreshold)

	tcp := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(6379)}},
		FailureThreshold: 6, InitialDelaySeconds: 10}
	got, err = Probe(tcp, c, "10.244.0.9")
	require.NoError(t, err)
	require.Equal(t, "10.244.0.9:6379", got.Addr)
	require.Equal(t, 6, got.FailureThreshold)
	require.Equal(t, 10*time.Second, got.InitialDelay)

	exec := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/relay", "backlog"}}}}
	got, err = Probe(exec, c, "")
	require.NoError(t, err)
	require.Equal(t, []string{"/relay", "backlog"}, got.Command)

	_, err = Probe(&corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromString("nope")}}}, c, "")
	require.ErrorContains(t, err, `no port named "nope"`)
}

func TestProbeResultThresholds(t *testing.T) {
	t.Parallel()
	tgt := ProbeTarget{SuccessThreshold: 2, FailureThreshold: 3}
	var r ProbeResult
	require.False(t, r.Observe(tgt, true), "one success of two")
	require.True(t, r.Observe(tgt, true), "ready after two")
	require.True(t, r.OK)
	require.False(t, r.Observe(tgt, false))
	require.False(t, r.Observe(tgt, false))
	require.False(t, r.Failed(tgt))
	require.True(t, r.Observe(tgt, false), "not ready after three failures")
	require.True(t, r.Failed(tgt))
	require.False(t, r.OK)
}

func TestShouldRestart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy corev1.RestartPolicy
		code   int32
		want   bool
	}{
		{corev1.RestartPolicyAlways, 0, true},
		{corev1.RestartPolicyAlways, 1, true},
		{"", 0, true},
		{corev1.RestartPolicyOnFailure, 0, false},
		{corev1.RestartPolicyOnFailure, 2, true},
		{corev1.RestartPolicyOnFailure, 143, true},
		{corev1.RestartPolicyNever, 0, false},
		{corev1.RestartPolicyNever, 1, false},
	} {
		require.Equal(t, tc.want, ShouldRestart(tc.policy, tc.code), "%s exit %d", tc.policy, tc.code)
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	require.Equal(t, 10*time.Second, Backoff(0))
	require.Equal(t, 20*time.Second, Backoff(1))
	require.Equal(t, 160*time.Second, Backoff(4))
	require.Equal(t, 5*time.Minute, Backoff(5))
	require.Equal(t, 5*time.Minute, Backoff(100))
	require.Equal(t, "Completed", TerminatedReason(0, false))
	require.Equal(t, "Error", TerminatedReason(3, false))
	require.Equal(t, "OOMKilled", TerminatedReason(137, true))
}

func running() corev1.ContainerStatus {
	return corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}, Ready: true}
}
func exited(code int32) corev1.ContainerStatus {
	return corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}}
}
func waiting() corev1.ContainerStatus {
	return corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}}
}
func backingOff(code int32) corev1.ContainerStatus {
	s := waiting()
	s.State.Waiting.Reason = "CrashLoopBackOff"
	s.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}
	return s
}

func TestPhase(t *testing.T) {
	t.Parallel()
	type S = []corev1.ContainerStatus
	for name, tc := range map[string]struct {
		policy     corev1.RestartPolicy
		init, main S
		want       corev1.PodPhase
	}{
		"not started":                  {corev1.RestartPolicyAlways, nil, S{waiting()}, corev1.PodPending},
		"running":                      {corev1.RestartPolicyAlways, nil, S{running()}, corev1.PodRunning},
		"one of two running":           {corev1.RestartPolicyAlways, nil, S{running(), waiting()}, corev1.PodPending},
		"crash loop stays running":     {corev1.RestartPolicyAlways, nil, S{backingOff(1)}, corev1.PodRunning},
		"job succeeded":                {corev1.RestartPolicyNever, nil, S{exited(0)}, corev1.PodSucceeded},
		"job failed":                   {corev1.RestartPolicyNever, nil, S{exited(3)}, corev1.PodFailed},
		"on failure: retrying":         {corev1.RestartPolicyOnFailure, nil, S{backingOff(1)}, corev1.PodRunning},
		"on failure: succeeded":        {corev1.RestartPolicyOnFailure, nil, S{exited(0)}, corev1.PodSucceeded},
		"always: exited is running":    {corev1.RestartPolicyAlways, nil, S{exited(0)}, corev1.PodRunning},
		"init running":                 {corev1.RestartPolicyAlways, S{running()}, S{waiting()}, corev1.PodPending},
		"init failed, never":           {corev1.RestartPolicyNever, S{exited(1)}, S{waiting()}, corev1.PodFailed},
		"init done, main running":      {corev1.RestartPolicyAlways, S{exited(0)}, S{running()}, corev1.PodRunning},
		"init backing off, on failure": {corev1.RestartPolicyOnFailure, S{backingOff(1)}, S{waiting()}, corev1.PodPending},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			spec := &corev1.PodSpec{RestartPolicy: tc.policy}
			require.Equal(t, tc.want, Phase(spec, tc.init, tc.main))
		})
	}
}

func TestConditions(t *testing.T) {
	t.Parallel()
	then := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	now := metav1.NewTime(then.Add(time.Minute))
	cond := func(cs []corev1.PodCondition, typ corev1.PodConditionType) corev1.PodCondition {
		for _, c := range cs {
			if c.Type == typ {
				return c
			}
		}
		t.Fatalf("no condition %s", typ)
		return corev1.PodCondition{}
	}
	notReady := running()
	notReady.Ready = false
	cs := Conditions(corev1.PodRunning, true, nil, []corev1.ContainerStatus{notReady}, nil, then)
	require.Equal(t, corev1.ConditionFalse, cond(cs, corev1.PodReady).Status)
	require.Equal(t, "ContainersNotReady", cond(cs, corev1.PodReady).Reason)
	require.Equal(t, corev1.ConditionTrue, cond(cs, corev1.PodInitialized).Status)

	cs2 := Conditions(corev1.PodRunning, true, nil, []corev1.ContainerStatus{running()}, cs, now)
	require.Equal(t, corev1.ConditionTrue, cond(cs2, corev1.PodReady).Status)
	require.Equal(t, now, cond(cs2, corev1.PodReady).LastTransitionTime, "changed: new transition time")
	require.Equal(t, then, cond(cs2, corev1.PodScheduled).LastTransitionTime, "unchanged: kept")

	done := Conditions(corev1.PodSucceeded, false, nil, []corev1.ContainerStatus{exited(0)}, nil, now)
	require.Equal(t, "PodCompleted", cond(done, corev1.PodReady).Reason)
	require.Equal(t, corev1.ConditionFalse, cond(done, corev1.PodReadyToStartContainers).Status)
}

func TestConfigErrorIsDistinct(t *testing.T) {
	t.Parallel()
	var cfgErr *ConfigError
	require.False(t, errors.As(&ImageError{Msg: "x"}, &cfgErr))
}

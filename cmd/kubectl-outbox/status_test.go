package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

var now = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func fixtureRelay() *v1alpha1.OutboxRelay {
	at := func(ago time.Duration) metav1.Time { return metav1.NewTime(now.Add(-ago)) }
	return &v1alpha1.OutboxRelay{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"},
		Spec:       v1alpha1.OutboxRelaySpec{Redis: v1alpha1.RedisSpec{Stream: "jobs"}},
		Status: v1alpha1.OutboxRelayStatus{
			Backlog:              ptr.To[int64](42),
			OldestPendingTime:    ptr.To(at(90 * time.Second)),
			LastBacklogCheckTime: ptr.To(at(3 * time.Second)),
			DeadLetters:          ptr.To[int64](2),
			DesiredReplicas:      ptr.To[int32](2),
			Replicas:             2,
			ReadyReplicas:        1,
			Conditions: []metav1.Condition{
				{Type: "Ready", Status: "False", Reason: "RelaysProgressing", Message: "1 of 2\nrelays available", LastTransitionTime: at(time.Minute)},
				{Type: "RedisDurable", Status: "False", Reason: "RedisPersistenceOff", Message: "no AOF, no RDB", LastTransitionTime: at(3 * time.Hour)},
				{Type: "StreamIntact", Status: "True", Reason: "NoStreamReset", Message: "no reset", LastTransitionTime: at(72 * time.Hour)},
			},
		},
	}
}

func TestStatusOf(t *testing.T) {
	t.Parallel()
	s := statusOf(fixtureRelay())
	require.Equal(t, "False", s.Ready)
	require.Equal(t, "outbox_events", s.Table, "the default table")
	require.Len(t, s.Conditions, 3)
	require.Equal(t, []string{"RedisDurable", "StreamIntact"}, []string{s.RedisChecks[0].Type, s.RedisChecks[1].Type})

	empty := statusOf(&v1alpha1.OutboxRelay{ObjectMeta: metav1.ObjectMeta{Name: "new"}})
	require.Equal(t, "Unknown", empty.Ready)
	require.Equal(t, "jobs", empty.Stream, "the default stream")
	require.NotNil(t, empty.Conditions, "[] in json, not null")
}

func TestPrintStatus(t *testing.T) {
	t.Parallel()
	s := statusOf(fixtureRelay())
	s.StreamInfo = &StreamInfo{Stream: "jobs", Exists: true, Length: 1200, Groups: []GroupInfo{
		{Name: "workers", Consumers: 3, Pending: 5, Lag: 17, LastDeliveredID: "1-0"},
		{Name: "audit", Consumers: 0, Pending: 0, Lag: -1, LastDeliveredID: "0-0"},
	}}
	var b bytes.Buffer
	require.NoError(t, printStatus(&b, s, now))
	out := b.String()
	for _, want := range []string{
		"OutboxRelay:      shop/orders",
		"Table -> stream:  outbox_events -> jobs",
		"Backlog:          42 (checked 3s ago)",
		"Oldest pending:   2026-12-01T11:58:30Z (90s ago)",
		"Replicas:         1/2 ready, desired 2",
		"Dead letters:     2 (kubectl outbox dead-letters list orders)",
		"Redis checks:     RedisDurable False (RedisPersistenceOff): no AOF, no RDB",
		"StreamIntact True (NoStreamReset): no reset",
		"Ready         False   RelaysProgressing    60s  1 of 2 relays available",
		"StreamIntact  True    NoStreamReset        3d",
		"Stream jobs: 1200 entries, 2 consumer groups",
		"workers  3          5        17       1-0",
		"audit    0          0        unknown  0-0",
	} {
		require.Contains(t, out, want)
	}

	s.StreamInfo, s.StreamInfoError = nil,
		"the relay pod orders-stream-info-x could not start: CreateContainerConfigError: secret \"orders-redis\" not found"
	b.Reset()
	require.NoError(t, printStatus(&b, s, now))
	require.Contains(t, b.String(), `Stream jobs: not read: the relay pod orders-stream-info-x could not start: CreateContainerConfigError`)

	s.StreamInfoError, s.StreamInfo = "", &StreamInfo{Stream: "jobs"}
	b.Reset()
	require.NoError(t, printStatus(&b, s, now))
	require.Contains(t, b.String(), "Stream jobs: does not exist (the first event creates it; after a loss: kubectl outbox replay orders)")
}

func TestPrintStatusExternalReplicas(t *testing.T) {
	t.Parallel()
	r := fixtureRelay()
	r.Spec.Replicas = v1alpha1.ReplicasSpec{Mode: v1alpha1.ReplicasModeExternal, Count: ptr.To[int32](2)}
	s := statusOf(r)
	require.Equal(t, "External", s.Replicas.Mode)
	var b bytes.Buffer
	require.NoError(t, printStatus(&b, s, now))
	require.Contains(t, b.String(), "desired 2 (replicas.mode External: set by an autoscaler through the scale subresource)")
	require.Equal(t, "Operator", statusOf(fixtureRelay()).Replicas.Mode, "the default mode")
}

func TestPrintStatusUnmeasured(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	require.NoError(t, printStatus(&b, statusOf(&v1alpha1.OutboxRelay{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "b"},
		Spec: v1alpha1.OutboxRelaySpec{Suspend: true}}), now))
	out := b.String()
	require.Contains(t, out, "Backlog:          unknown\n")
	require.Contains(t, out, "Oldest pending:   unknown\n")
	require.Contains(t, out, "Suspended:        yes (spec.suspend: the relays are scaled to 0; kubectl outbox resume b)")
	require.Contains(t, out, "Redis checks:     not run yet")
	require.Contains(t, out, "Stream jobs: not read (--stream-info=false)")
}

func TestPrintList(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	require.NoError(t, printList(&b, []Status{statusOf(fixtureRelay())}, now))
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	require.Len(t, lines, 2)
	require.Equal(t, []string{"NAME", "STREAM", "BACKLOG", "OLDEST", "REPLICAS", "READY", "REASON", "DEAD", "LETTERS", "SUSPENDED"},
		strings.Fields(lines[0]))
	require.Equal(t, []string{"orders", "jobs", "42", "90s", "1/2", "False", "RelaysProgressing", "2", "false"}, strings.Fields(lines[1]))
}

func TestEncode(t *testing.T) {
	t.Parallel()
	s := statusOf(fixtureRelay())
	s.StreamInfo = &StreamInfo{Stream: "jobs", Exists: true, Length: 3, Groups: []GroupInfo{{Name: "workers", Lag: 1}}}
	var b bytes.Buffer
	require.NoError(t, encode(&b, "json", s))
	var back map[string]any
	require.NoError(t, json.Unmarshal(b.Bytes(), &back))
	require.Equal(t, float64(42), back["backlog"])
	require.Equal(t, "2026-12-01T11:58:30Z", back["oldestPending"])
	require.Equal(t, float64(3), back["streamInfo"].(map[string]any)["length"])
	require.NotContains(t, back, "streamInfoError")

	b.Reset()
	require.NoError(t, encode(&b, "yaml", s))
	var y Status
	require.NoError(t, yaml.Unmarshal(b.Bytes(), &y))
	require.Equal(t, s.Conditions[1].Reason, y.Conditions[1].Reason)
	require.Equal(t, int64(1), y.StreamInfo.Groups[0].Lag)

	require.ErrorContains(t, encode(&b, "wide", s), `must be text, json or yaml`)
}

func TestParseStreamInfo(t *testing.T) {
	t.Parallel()
	out := `{"level":"WARN","msg":"something"}
{"stream":"jobs","exists":true,"length":7,"groups":[{"name":"workers","consumers":1,"pending":0,"lag":0,"lastDeliveredId":"5-0"}]}
`
	info, err := parseStreamInfo([]byte(out))
	require.NoError(t, err)
	require.Equal(t, int64(7), info.Length)
	require.Equal(t, "workers", info.Groups[0].Name)

	_, err = parseStreamInfo([]byte("relay: REDIS_URL is not set\n"))
	require.ErrorContains(t, err, "REDIS_URL is not set")
}

func TestAge(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{-time.Second: "0s", 5 * time.Second: "5s", 3 * time.Minute: "3m",
		5 * time.Hour: "5h", 49 * time.Hour: "2d"} {
		require.Equal(t, want, age(d), d)
	}
}

func TestChangedFlags(t *testing.T) {
	t.Parallel()
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	deadLetterFlags(true)(fs)
	require.NoError(t, fs.Parse([]string{"--id", "3", "--id=4,5", "--all=false", "-o", "json"}))
	require.Equal(t, []string{"--all=false", "--id=3,4,5", "--output=json"}, changedFlags(fs))
}

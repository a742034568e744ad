package main

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
	"github.com/outbox-dev/outbox-operator/pkg/contract"
)

// Status is what `kubectl outbox status NAME` shows, and prints with -o
// json|yaml: the OutboxRelay's status, and the stream as Redis sees it.
type Status struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Table     string `json:"table"`
	Stream    string `json:"stream"`
	Suspended bool   `json:"suspended"`
	Ready     string `json:"ready"`

	Backlog          *int64       `json:"backlog"`
	OldestPending    *metav1.Time `json:"oldestPending"`
	LastBacklogCheck *metav1.Time `json:"lastBacklogCheck,omitempty"`
	DeadLetters      *int64       `json:"deadLetters"`

	Replicas Replicas `json:"replicas"`

	// Conditions are every condition of the status; RedisChecks those of
	// them about Redis (RedisDurable, StreamIntact).
	Conditions  []Condition `json:"conditions"`
	RedisChecks []Condition `json:"redisChecks"`

	// StreamInfo is from `relay stream-info`, run in the cluster; when it
	// could not run, StreamInfoError says why.
	StreamInfo      *StreamInfo `json:"streamInfo,omitempty"`
	StreamInfoError string      `json:"streamInfoError,omitempty"`
}

// Replicas are the relay replicas of the status.
type Replicas struct {
	// Mode is spec.replicas.mode: who sets Desired (Operator or External).
	Mode    string `json:"mode"`
	Desired *int32 `json:"desired"`
	Current int32  `json:"current"`
	Ready   int32  `json:"ready"`
}

// Condition is one status condition.
type Condition struct {
	Type               string      `json:"type"`
	Status             string      `json:"status"`
	Reason             string      `json:"reason"`
	Message            string      `json:"message"`
	LastTransitionTime metav1.Time `json:"lastTransitionTime"`
}

// StreamInfo and GroupInfo are the output of `relay stream-info --output
// json` (pkg/contract: the relay writes it).
type (
	StreamInfo = contract.StreamInfo
	GroupInfo  = contract.GroupInfo
)

// redisConditions are the conditions that carry the Redis checks.
var redisConditions = map[string]bool{
	string(v1alpha1.ConditionRedisDurable): true,
	string(v1alpha1.ConditionStreamIntact): true,
}

// statusOf is the Status of an OutboxRelay, without the stream's info.
func statusOf(r *v1alpha1.OutboxRelay) Status {
	s := Status{
		Name: r.Name, Namespace: r.Namespace,
		Table: r.Spec.Postgres.GetTable(), Stream: r.Spec.Redis.GetStream(),
		Suspended:        r.Spec.Suspend,
		Ready:            "Unknown",
		Backlog:          r.Status.Backlog,
		OldestPending:    r.Status.OldestPendingTime,
		LastBacklogCheck: r.Status.LastBacklogCheckTime,
		DeadLetters:      r.Status.DeadLetters,
		Replicas: Replicas{Mode: string(cmp.Or(r.Spec.Replicas.Mode, v1alpha1.ReplicasModeOperator)),
			Desired: r.Status.DesiredReplicas, Current: r.Status.Replicas, Ready: r.Status.ReadyReplicas},
		Conditions:  []Condition{},
		RedisChecks: []Condition{},
	}
	if c := meta.FindStatusCondition(r.Status.Conditions, string(v1alpha1.ConditionReady)); c != nil {
		s.Ready = string(c.Status)
	}
	for _, c := range r.Status.Conditions {
		cond := Condition{Type: c.Type, Status: string(c.Status), Reason: c.Reason, Message: c.Message, LastTransitionTime: c.LastTransitionTime}
		s.Conditions = append(s.Conditions, cond)
		if redisConditions[c.Type] {
			s.RedisChecks = append(s.RedisChecks, cond)
		}
	}
	return s
}

// parseStreamInfo finds the stream-info JSON line in a pod's output (the
// relay's own log lines may be there too).
func parseStreamInfo(out []byte) (*StreamInfo, error) {
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	for i := len(lines) - 1; i >= 0; i-- {
		var info StreamInfo
		if strings.HasPrefix(lines[i], "{") && json.Unmarshal([]byte(lines[i]), &info) == nil && info.Stream != "" {
			if info.Groups == nil {
				info.Groups = []GroupInfo{}
			}
			return &info, nil
		}
	}
	return nil, fmt.Errorf("no stream-info output in %q", strings.TrimSpace(string(out)))
}

// unknown is what status prints for a value it could not read.
const unknown = "unknown"

func orNone[T any](p *T, f func(T) string) string {
	if p == nil {
		return unknown
	}
	return f(*p)
}

// age is a duration as kubectl prints ages: 5s, 3m, 2h, 4d.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}

// printStatus writes the text form of one OutboxRelay's status.
func printStatus(w io.Writer, s Status, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	suspended := "no"
	if s.Suspended {
		suspended = "yes (spec.suspend: the relays are scaled to 0; kubectl outbox resume " + s.Name + ")"
	}
	oldest := "none"
	if s.OldestPending != nil {
		oldest = fmt.Sprintf("%s (%s ago)", s.OldestPending.UTC().Format(time.RFC3339), age(now.Sub(s.OldestPending.Time)))
	} else if s.Backlog == nil {
		oldest = unknown
	}
	backlog := orNone(s.Backlog, func(v int64) string { return fmt.Sprint(v) })
	if s.LastBacklogCheck != nil {
		backlog += fmt.Sprintf(" (checked %s ago)", age(now.Sub(s.LastBacklogCheck.Time)))
	}
	desired := orNone(s.Replicas.Desired, func(v int32) string { return fmt.Sprint(v) })
	if s.Replicas.Mode == string(v1alpha1.ReplicasModeExternal) {
		desired += " (replicas.mode External: set by an autoscaler through the scale subresource)"
	}
	dead := orNone(s.DeadLetters, func(v int64) string { return fmt.Sprint(v) })
	if s.DeadLetters != nil && *s.DeadLetters > 0 {
		dead += " (kubectl outbox dead-letters list " + s.Name + ")"
	}
	_, _ = fmt.Fprintf(tw, "OutboxRelay:\t%s/%s\n", s.Namespace, s.Name)
	_, _ = fmt.Fprintf(tw, "Table -> stream:\t%s -> %s\n", s.Table, s.Stream)
	_, _ = fmt.Fprintf(tw, "Ready:\t%s\n", s.Ready)
	_, _ = fmt.Fprintf(tw, "Suspended:\t%s\n", suspended)
	_, _ = fmt.Fprintf(tw, "Backlog:\t%s\n", backlog)
	_, _ = fmt.Fprintf(tw, "Oldest pending:\t%s\n", oldest)
	_, _ = fmt.Fprintf(tw, "Replicas:\t%d/%d ready, desired %s\n", s.Replicas.Ready, s.Replicas.Current, desired)
	_, _ = fmt.Fprintf(tw, "Dead letters:\t%s\n", dead)
	if len(s.RedisChecks) == 0 {
		_, _ = fmt.Fprintf(tw, "Redis checks:\tnot run yet\n")
	}
	for i, c := range s.RedisChecks {
		label := ""
		if i == 0 {
			label = "Redis checks:"
		}
		_, _ = fmt.Fprintf(tw, "%s\t%s %s (%s): %s\n", label, c.Type, c.Status, c.Reason, oneLine(c.Message))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	_, _ = fmt.Fprintln(w, "\nConditions:")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "  TYPE\tSTATUS\tREASON\tAGE\tMESSAGE")
	for _, c := range s.Conditions {
		_, _ = fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason, age(now.Sub(c.LastTransitionTime.Time)), oneLine(c.Message))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	_, _ = fmt.Fprintln(w)
	switch {
	case s.StreamInfoError != "":
		_, _ = fmt.Fprintf(w, "Stream %s: not read: %s\n", s.Stream, s.StreamInfoError)
	case s.StreamInfo == nil:
		_, _ = fmt.Fprintf(w, "Stream %s: not read (--stream-info=false)\n", s.Stream)
	case !s.StreamInfo.Exists:
		_, _ = fmt.Fprintf(w, "Stream %s: does not exist (the first event creates it; after a loss: kubectl outbox replay %s)\n",
			s.Stream, s.Name)
	default:
		_, _ = fmt.Fprintf(w, "Stream %s: %d entries, %d consumer groups\n", s.Stream, s.StreamInfo.Length, len(s.StreamInfo.Groups))
		if len(s.StreamInfo.Groups) > 0 {
			tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			_, _ = fmt.Fprintln(tw, "  GROUP\tCONSUMERS\tPENDING\tLAG\tLAST DELIVERED")
			for _, g := range s.StreamInfo.Groups {
				lag := fmt.Sprint(g.Lag)
				if g.Lag < 0 {
					lag = unknown
				}
				_, _ = fmt.Fprintf(tw, "  %s\t%d\t%d\t%s\t%s\n", g.Name, g.Consumers, g.Pending, lag, g.LastDeliveredID)
			}
			return tw.Flush()
		}
	}
	return nil
}

// printList writes one line per OutboxRelay.
func printList(w io.Writer, list []Status, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "NAME\tSTREAM\tBACKLOG\tOLDEST\tREPLICAS\tREADY\tREASON\tDEAD LETTERS\tSUSPENDED")
	for _, s := range list {
		oldest := ""
		if s.OldestPending != nil {
			oldest = age(now.Sub(s.OldestPending.Time))
		}
		reason := ""
		for _, c := range s.Conditions {
			if c.Type == string(v1alpha1.ConditionReady) {
				reason = c.Reason
			}
		}
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\t%t\n", s.Name, s.Stream,
			orNone(s.Backlog, func(v int64) string { return fmt.Sprint(v) }), oldest,
			s.Replicas.Ready, s.Replicas.Current, s.Ready, reason,
			orNone(s.DeadLetters, func(v int64) string { return fmt.Sprint(v) }), s.Suspended)
	}
	return tw.Flush()
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// encode writes v as json or yaml.
func encode(w io.Writer, output string, v any) error {
	switch output {
	case outputJSON:
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case outputYAML:
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	return fmt.Errorf("-o %q: must be text, json or yaml", output)
}

func newStatusCommand(p *plugin) *cobra.Command {
	var output string
	var streamInfo bool
	var o runOptions
	cmd := &cobra.Command{
		Use:   "status [NAME]",
		Short: "Show OutboxRelays at a glance: backlog, replicas, conditions, dead letters, Redis, the stream's consumer groups",
		Long: `Without NAME: one line per OutboxRelay of the namespace. With NAME: its backlog and
oldest pending row, replicas, dead letters, every condition with its reason and message,
the Redis checks (conditions RedisDurable and StreamIntact), and the stream's length and
each consumer group's consumers, pending count and lag. The stream is read by running
relay stream-info in a short-lived pod with the relay's Secrets (--stream-info=false
skips it: the status alone needs only get on outboxrelays).`,
		Example: `  kubectl outbox status
  kubectl outbox status orders
  kubectl outbox status orders -o yaml
  kubectl outbox status orders --stream-info=false`,
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: p.completeRelayNames,
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != outputText && output != outputJSON && output != outputYAML {
				return fmt.Errorf("-o %q: must be text, json or yaml", output)
			}
			ctx := cmd.Context()
			if len(args) == 0 {
				if err := p.connect(); err != nil {
					return err
				}
				var list v1alpha1.OutboxRelayList
				if err := p.client.List(ctx, &list, client.InNamespace(p.namespace)); err != nil {
					return fmt.Errorf("listing outboxrelays in namespace %q: %w", p.namespace, err)
				}
				out := make([]Status, 0, len(list.Items))
				for i := range list.Items {
					out = append(out, statusOf(&list.Items[i]))
				}
				if output != outputText {
					return encode(cmd.OutOrStdout(), output, out)
				}
				if len(out) == 0 {
					_, err := fmt.Fprintf(cmd.ErrOrStderr(), "No OutboxRelay in namespace %s.\n", p.namespace)
					return err
				}
				return printList(cmd.OutOrStdout(), out, time.Now())
			}
			relay, err := p.relay(ctx, args[0])
			if err != nil {
				return err
			}
			s := statusOf(relay)
			if streamInfo {
				var buf, errBuf bytes.Buffer
				err := p.run(ctx, &o, relayRun{relay: relay, command: []string{"stream-info"},
					flags:     []string{"--stream=" + s.Stream, "--output=json", "--log-level=error"},
					withRedis: true, stdout: &buf, stderr: &errBuf})
				if err == nil {
					s.StreamInfo, err = parseStreamInfo(buf.Bytes())
				} else if out := strings.TrimSpace(buf.String()); out != "" {
					err = fmt.Errorf("%w: %s", err, oneLine(out))
				}
				if err != nil {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					s.StreamInfoError = err.Error()
				}
			}
			if output != outputText {
				return encode(cmd.OutOrStdout(), output, s)
			}
			return printStatus(cmd.OutOrStdout(), s, time.Now())
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", outputText, "text, json or yaml")
	cmd.Flags().BoolVar(&streamInfo, "stream-info", true, "read the stream's length and consumer groups (runs relay stream-info in a pod)")
	cmd.Flags().StringVar(&o.image, "image", "", "the relay image of the stream-info pod (default: the image of the relay Deployment)")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 2*time.Minute, "end the stream-info pod after this long")
	return cmd
}

package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/outbox-dev/outbox-operator/internal/controller"
)

// relayCommand describes one plugin command that runs a relay subcommand.
type relayCommand struct {
	use, short, long, example string
	command                   []string // the relay subcommand
	withRedis                 bool
	// addFlags declares the relay flags the command forwards (only those
	// given on the command line are forwarded: the relay's defaults apply).
	addFlags func(fs *pflag.FlagSet)
	// fixedFlags are flags from the OutboxRelay (its stream, ...), before
	// the forwarded ones.
	fixedFlags func(r relayRun) []string
}

// newRelayCommand builds a command `<use> NAME [flags] [-- RELAY-FLAGS...]`.
func newRelayCommand(p *plugin, rc relayCommand) *cobra.Command {
	var o runOptions
	forwarded := pflag.NewFlagSet(rc.use, pflag.ContinueOnError)
	if rc.addFlags != nil {
		rc.addFlags(forwarded)
	}
	cmd := &cobra.Command{
		Use:               rc.use + " NAME [flags] [-- RELAY-FLAGS...]",
		Short:             rc.short,
		Long:              rc.long + "\n\nFlags after -- go to the relay as they are (docs/relay-cli.md lists them).",
		Example:           rc.example,
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: p.completeRelayNames,
		RunE: func(cmd *cobra.Command, args []string) error {
			extra := []string{}
			if dash := cmd.ArgsLenAtDash(); dash >= 0 {
				if dash != 1 {
					return fmt.Errorf("expected one OutboxRelay name before --, got %d arguments", dash)
				}
				extra = args[dash:]
			} else if len(args) != 1 {
				return fmt.Errorf("expected one OutboxRelay name, got %q (relay flags go after --)", args)
			}
			relay, err := p.relay(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			run := relayRun{relay: relay, command: rc.command, withRedis: rc.withRedis,
				stdout: cmd.OutOrStdout(), stderr: cmd.ErrOrStderr()}
			if rc.fixedFlags != nil {
				run.flags = rc.fixedFlags(run)
			}
			run.flags = append(run.flags, changedFlags(forwarded)...)
			run.flags = append(run.flags, extra...)
			return p.run(cmd.Context(), &o, run)
		},
	}
	cmd.Flags().AddFlagSet(forwarded)
	cmd.Flags().StringVar(&o.image, "image", "", "the relay image (default: the image of the OutboxRelay's relay Deployment)")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 0, "end the pod after this long (activeDeadlineSeconds); 0: no limit")
	return cmd
}

// changedFlags are the flags set on the command line, as --name=value (a
// slice as a comma-separated list), in the order of the flag set.
func changedFlags(fs *pflag.FlagSet) []string {
	var out []string
	fs.VisitAll(func(f *pflag.Flag) {
		if !f.Changed {
			return
		}
		v := f.Value.String()
		if s, ok := f.Value.(pflag.SliceValue); ok {
			v = strings.Join(s.GetSlice(), ",")
		}
		out = append(out, "--"+f.Name+"="+v)
	})
	return out
}

// budgetFlags are the OutboxRelay's spec.relay.batchBytes, when set, for
// the commands that read many payloads (retry, replay): their pod has the
// relay's resources, whose memory limit is sized from that budget.
func budgetFlags(r relayRun) []string {
	if b := r.relay.Spec.Relay.BatchBytes; b != nil {
		return []string{"--batch-bytes=" + strconv.FormatInt(b.Value(), 10)}
	}
	return nil
}

func streamFlags(r relayRun) []string {
	flags := []string{"--stream=" + r.relay.Spec.Redis.GetStream()}
	if d := r.relay.Spec.Redis.DeadLetterStream; d != "" {
		flags = append(flags, "--dead-letter-stream="+d)
	}
	return flags
}

// waitFlags are the OutboxRelay's spec.redis.waitReplicas and waitTimeout,
// for the commands that publish (retry, replay): what they add is
// acknowledged by as many replicas as the relays' batches.
func waitFlags(r relayRun) []string {
	red := &r.relay.Spec.Redis
	if red.WaitReplicas <= 0 {
		return nil
	}
	flags := []string{fmt.Sprintf("--wait-replicas=%d", red.WaitReplicas)}
	if red.WaitTimeout != nil {
		flags = append(flags, "--wait-timeout="+red.WaitTimeout.Duration.String())
	}
	return flags
}

// The values of -o: text (the default) and json on every command that prints
// a result (the relay's --output); status also prints yaml.
const (
	outputText = "text"
	outputJSON = "json"
	outputYAML = "yaml"
)

func outputFlag(fs *pflag.FlagSet) { fs.StringP("output", "o", outputText, "text or json") }

func newDoctorCommand(p *plugin) *cobra.Command {
	return newRelayCommand(p, relayCommand{
		use:   "doctor",
		short: "Run the relay's preflight checks (table, index, privileges, Redis durability) in the cluster",
		long: `Runs relay doctor in a pod with the OutboxRelay's Secrets, table layout, stream and
dead-letter stream: one line per check (ok, info, warn, fail) with the fix. The exit
status is the relay's: 1 when a check fails.`,
		example: `  kubectl outbox doctor orders
  kubectl outbox doctor orders -o json
  kubectl outbox doctor orders --skip-redis`,
		command:   []string{"doctor"},
		withRedis: true,
		addFlags: func(fs *pflag.FlagSet) {
			outputFlag(fs)
			fs.Bool("skip-postgres", false, "check Redis only")
			fs.Bool("skip-redis", false, "check PostgreSQL only")
		},
		fixedFlags: func(r relayRun) []string { return append(streamFlags(r), slotFlags(r)...) },
	})
}

// slotFlags name the replication slot of an OutboxRelay of source
// LogicalReplication (none otherwise), as its relays and cleanup CronJob
// get it: cleanup deletes by the slot's progress (its rows are never
// marked dispatched, so cleanup without it deletes nothing), doctor checks
// the slot.
func slotFlags(r relayRun) []string {
	if !r.relay.Spec.ReadsLogicalReplication() {
		return nil
	}
	return []string{"--slot=" + controller.ReplicationSlotName(r.relay)}
}

func newBacklogCommand(p *plugin) *cobra.Command {
	return newRelayCommand(p, relayCommand{
		use:   "backlog",
		short: "Count the undispatched rows, the oldest one and the parked rows, now (relay backlog)",
		long: `Runs relay backlog in a pod: the count measured now, not the one of the last
backlog check in the status (kubectl outbox status shows that one).`,
		example: `  kubectl outbox backlog orders
  kubectl outbox backlog orders -o json`,
		command:  []string{"backlog"},
		addFlags: outputFlag,
	})
}

func newCleanupCommand(p *plugin) *cobra.Command {
	return newRelayCommand(p, relayCommand{
		use:   "cleanup",
		short: "Delete dispatched rows older than the retention now, in batches (relay cleanup)",
		long: `Runs relay cleanup in a pod, as the OutboxRelay's cleanup CronJob does, with its
spec.cleanup.retention and batchSize unless given here. Parked rows are never deleted.`,
		example: `  kubectl outbox cleanup orders
  kubectl outbox cleanup orders --retention 24h
  kubectl outbox cleanup orders --drop-partitions`,
		command: []string{"cleanup"},
		addFlags: func(fs *pflag.FlagSet) {
			fs.Duration("retention", 0, "keep dispatched rows this long (default: spec.cleanup.retention)")
			fs.Int("batch-size", 0, "rows deleted per statement (default: spec.cleanup.batchSize)")
			fs.Bool("drop-partitions", false, "first drop partitions whose rows are all dispatched past the retention (needs the table's owner)")
		},
		fixedFlags: cleanupFlags,
	})
}

// cleanupFlags are the cleanup CronJob's: the retention, the batch size
// and, for source LogicalReplication, the slot.
func cleanupFlags(r relayRun) []string {
	c := r.relay.Spec.Cleanup
	return append([]string{"--retention=" + c.GetRetention().String(), fmt.Sprintf("--batch-size=%d", c.GetBatchSize())},
		slotFlags(r)...)
}

func deadLetterFlags(selecting bool) func(fs *pflag.FlagSet) {
	return func(fs *pflag.FlagSet) {
		fs.StringSlice("id", nil, "parked row ids (the ID column of list), repeated or comma-separated")
		fs.String("since", "", "only rows parked at or after this time (RFC 3339)")
		fs.String("until", "", "only rows parked before this time (RFC 3339)")
		outputFlag(fs)
		if selecting {
			fs.Bool("all", false, "every parked row (narrowed by --since and --until); required without --id")
		}
	}
}

// relayDeadLetters is the relay's command group of the parked rows; kubectl
// outbox dead-letters has the same name and runs its subcommands.
const relayDeadLetters = "dead-letters"

func newDeadLettersCommand(p *plugin) *cobra.Command {
	cmd := &cobra.Command{
		Use:     relayDeadLetters,
		Aliases: []string{"dl"},
		Short:   "List, retry or discard the rows parked because they could not be published",
		Long: `Rows that can never be published (a NULL column, a payload over the limit, an entry
Redis refuses) are parked in <table>_dead_letters until a person retries them (after
fixing the cause) or discards them. Each subcommand runs relay dead-letters in a pod.`,
		Example: `  kubectl outbox dead-letters list orders
  kubectl outbox dead-letters retry orders --id 7
  kubectl outbox dead-letters discard orders --all --until 2026-12-01T00:00:00Z`,
	}
	cmd.AddCommand(
		newRelayCommand(p, relayCommand{
			use:   "list",
			short: "List the parked rows, oldest first",
			long:  "Runs relay dead-letters list in a pod: id, event id, type, stream, when, attempts, size, reason.",
			example: `  kubectl outbox dead-letters list orders
  kubectl outbox dead-letters list orders --since 2026-12-01T00:00:00Z -o json`,
			command: []string{relayDeadLetters, "list"},
			addFlags: func(fs *pflag.FlagSet) {
				deadLetterFlags(false)(fs)
				fs.Int("limit", 1000, "most rows listed")
			},
		}),
		newRelayCommand(p, relayCommand{
			use:   "retry",
			short: "Publish parked rows again, each to its stream; those Redis acknowledged are removed",
			long: `Runs relay dead-letters retry in a pod. A row that still cannot be published stays
parked with its new reason, and the command exits 1.`,
			example: `  kubectl outbox dead-letters retry orders --id 7,8
  kubectl outbox dead-letters retry orders --all`,
			command:   []string{relayDeadLetters, "retry"},
			withRedis: true,
			addFlags: func(fs *pflag.FlagSet) {
				deadLetterFlags(true)(fs)
				fs.Int("max-payload-bytes", 0, "larger payloads stay parked, unread (default: the relay's, 16 MiB)")
				fs.Int("batch-bytes", 0, "payload bytes read per page (default: the OutboxRelay's spec.relay.batchBytes, or 16 MiB)")
			},
			fixedFlags: func(r relayRun) []string { return append(waitFlags(r), budgetFlags(r)...) },
		}),
		newRelayCommand(p, relayCommand{
			use:   "discard",
			short: "Delete parked rows for good",
			long:  "Runs relay dead-letters discard in a pod. The rows are gone: list them first.",
			example: `  kubectl outbox dead-letters discard orders --id 7
  kubectl outbox dead-letters discard orders --all --until 2026-12-01T00:00:00Z`,
			command:  []string{relayDeadLetters, "discard"},
			addFlags: deadLetterFlags(true),
		}),
	)
	return cmd
}

func newReplayCommand(p *plugin) *cobra.Command {
	return newRelayCommand(p, relayCommand{
		use:   "replay",
		short: "Republish to the stream the rows dispatched in a window, after the stream lost entries",
		long: `Runs relay replay in a pod against the OutboxRelay's stream: the rows dispatched
since --since (until --until, default now), or with --pending the windows of the stream
resets the relays recorded (condition StreamIntact False). At least once: running it
twice only duplicates, and consumers dedupe on event_id. For an OutboxRelay of source
LogicalReplication, which marks no row, the rows created in the window instead, and
with --pending every row that cleanup kept; only --pending ends its resets (an event
reaches the stream any time after its row's created_at, so no window of created_at
covers a reset).`,
		example: `  kubectl outbox replay orders --since 2026-12-01T10:00:00Z
  kubectl outbox replay orders --pending
  kubectl outbox replay orders --since 2026-12-01T10:00:00Z --until 2026-12-01T11:00:00Z -o json`,
		command:   []string{"replay"},
		withRedis: true,
		addFlags: func(fs *pflag.FlagSet) {
			fs.String("since", "", "republish rows dispatched at or after this time (RFC 3339); required without --pending")
			fs.String("until", "", "and before this time (RFC 3339; default now)")
			fs.Bool("pending", false, "replay the windows of the stream resets recorded and not replayed yet")
			fs.Int("batch-size", 0, "entries per pipeline (default: the relay's, 500)")
			fs.Int("batch-bytes", 0, "bytes per pipeline (default: the OutboxRelay's spec.relay.batchBytes, or 16 MiB)")
			outputFlag(fs)
		},
		fixedFlags: replayFlags,
	})
}

// replayFlags are the flags of relay replay that come from the OutboxRelay:
// its stream, the replicas to wait for, its batches' byte budget, and for
// source LogicalReplication, which marks no row dispatched, --source (the
// rows are selected by created_at).
func replayFlags(r relayRun) []string {
	flags := append([]string{"--stream=" + r.relay.Spec.Redis.GetStream()}, waitFlags(r)...)
	flags = append(flags, budgetFlags(r)...)
	if r.relay.Spec.ReadsLogicalReplication() {
		flags = append(flags, "--source="+string(r.relay.Spec.GetSource()))
	}
	return flags
}

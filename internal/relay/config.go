package relay

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-dev/outbox-operator/internal/logical"
	"github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/pkg/contract"
)

// Defaults of Config.
const (
	DefaultStream    = contract.DefaultStream
	DefaultBatchSize = 500
	// DefaultBatchBytes is the default byte budget of a batch (BatchBytes).
	DefaultBatchBytes       = 16 << 20
	DefaultPollInterval     = 500 * time.Millisecond
	DefaultBusyPollInterval = 5 * time.Millisecond
	DefaultPublishTimeout   = 5 * time.Second
	DefaultMaxPayloadBytes  = 16 << 20
	DefaultMinBackoff       = 100 * time.Millisecond
	DefaultMaxBackoff       = 30 * time.Second
	// DefaultMissingTableBackoff is the slower retry while the table is
	// missing: that is a deployment mistake, not a blip.
	DefaultMissingTableBackoff = 30 * time.Second
	// DefaultInFlight is the number of batches a relay keeps in flight.
	DefaultInFlight = 2
	// MaxBatchSize bounds BatchSize.
	MaxBatchSize = 10000
	// MinBatchBytes bounds BatchBytes from below.
	MinBatchBytes = 64 << 10
)

// Ordering is what a relay promises about the order of the stream.
type Ordering string

// The orderings (docs/relay.md, "Ordering").
const (
	// OrderingNone: any number of relays, no order promised across
	// batches. The throughput mode, and the default.
	OrderingNone Ordering = "None"
	// OrderingStrict: one active relay per table (the leader, fenced), the
	// stream in claim order: (created_at, id) among the rows committed when
	// they were claimed.
	OrderingStrict Ordering = "Strict"
	// OrderingPerKey: the key column's values hashed into Partitions, each
	// owned by one relay at a time (fenced), many relays; the stream in claim
	// order per key.
	OrderingPerKey Ordering = "PerKey"
)

// ParseOrdering reads an ordering name, case-insensitively.
func ParseOrdering(s string) (Ordering, error) {
	for _, o := range []Ordering{OrderingNone, OrderingStrict, OrderingPerKey} {
		if strings.EqualFold(s, string(o)) {
			return o, nil
		}
	}
	return "", fmt.Errorf("ordering %q: must be None, Strict or PerKey", s)
}

// Source is where a relay reads events.
type Source string

// The sources (docs/relay.md, "Which mode").
const (
	// SourcePolling claims pending rows with SQL: the default.
	SourcePolling Source = "Polling"
	// SourceLogicalReplication streams the table's inserts from a
	// replication slot, in commit order (replicate.go).
	SourceLogicalReplication Source = "LogicalReplication"
)

// ParseSource reads a source name, case-insensitively.
func ParseSource(s string) (Source, error) {
	for _, v := range []Source{SourcePolling, SourceLogicalReplication} {
		if strings.EqualFold(s, string(v)) {
			return v, nil
		}
	}
	return "", fmt.Errorf("source %q: must be Polling or LogicalReplication", s)
}

// Config configures a Relay. Zero values take the defaults above.
type Config struct {
	// Table is the outbox table; required.
	Table *outbox.Table
	// Stream is the Redis stream events are added to.
	Stream string
	// DeadLetterStream receives rows that can never be published;
	// default Stream + ".dead".
	DeadLetterStream string
	// BatchSize is the number of rows claimed per transaction.
	BatchSize int
	// BatchBytes bounds the ids, types and payloads a batch holds in
	// memory: a claim that reads more is rolled back and claimed again with
	// the rows that fit (outbox.Limit), so rows of large payloads are
	// claimed a few at a time instead of a whole BatchSize into memory
	// (out of memory, then a crash loop). A single row larger than the
	// budget is still claimed, alone. Default DefaultBatchBytes.
	BatchBytes int
	// PollInterval is the pause after a pass that found nothing.
	PollInterval time.Duration
	// BusyPollInterval is the shorter pause after a pass that found rows
	// but not a full batch: while events flow, the relay polls often, so
	// latency stays low without the NOTIFY trigger; once the outbox is idle
	// it falls back to PollInterval. Capped at PollInterval.
	BusyPollInterval time.Duration
	// InFlight is the number of batches in flight at once, each in its own
	// transaction: with 2, the next batch is claimed while the previous one
	// is published and committed. One claimer hands batches in claim order
	// to one publisher, and a failed batch rolls back those claimed after
	// it, so within one relay the stream keeps claim order either way. 1
	// makes the relay strictly sequential.
	InFlight int
	// PublishTimeout is the deadline of one batch's pipeline to Redis. The
	// transaction holds its row locks for at most about this long.
	PublishTimeout time.Duration
	// MaxLen trims the stream approximately (XADD MAXLEN ~ n); 0 keeps
	// every entry.
	MaxLen int64
	// MaxPayloadBytes is the largest payload published; larger ones are
	// dead-lettered.
	MaxPayloadBytes int
	// MinBackoff and MaxBackoff bound the retry delay after a failure.
	MinBackoff, MaxBackoff time.Duration
	// MissingTableBackoff is the retry delay while the table is missing.
	MissingTableBackoff time.Duration
	// WaitReplicas, when positive, makes every batch WAIT for that many
	// replicas to acknowledge its entries (within WaitTimeout) before the
	// commit; fewer roll the batch back (wait.go).
	WaitReplicas int
	// WaitTimeout bounds that WAIT; default DefaultWaitTimeout. It must be
	// below PublishTimeout.
	WaitTimeout time.Duration
	// Trim is the stream's trimming policy, applied by a background loop
	// that never removes an entry a consumer group has not yet been
	// delivered and acknowledged (trim.go); zero: no trimming.
	Trim TrimPolicy
	// TableCheckInterval is how often the relay refreshes its row in the
	// table's relays table and looks for relays of other streams or of the
	// other source (shared.go); default DefaultTableCheckInterval.
	TableCheckInterval time.Duration
	// StreamCheckInterval is how often the stream is looked at between
	// batches for a reset, and its consumer groups' positions read;
	// default DefaultStreamCheckInterval (streamloss.go).
	StreamCheckInterval time.Duration
	// Source is where events come from; default SourcePolling.
	Source Source
	// Slot is the replication slot (source LogicalReplication), one per
	// OutboxRelay: a slot serves one relay at a time, the others stand by.
	Slot string
	// Replication is the connection config of the replication stream
	// (source LogicalReplication): the DSN's, for a role with the
	// REPLICATION attribute.
	Replication *pgconn.Config
	// CatchUpMargin reaches back before the last recorded commit when a new
	// slot's relay reads the rows its stream cannot hold; default
	// DefaultCatchUpMargin.
	CatchUpMargin time.Duration
	// Dispatch is what a claim does with its rows, the cleanup mode:
	// outbox.MarkDispatched (the default; cleanup deletes them after the
	// retention) or outbox.DeleteOnDispatch (deleted by the batch's commit,
	// after the XADDs were acknowledged; nothing is left to replay).
	Dispatch outbox.Dispatch
	// AutoReplay makes the relay republish, by itself, the rows dispatched
	// in the window of a stream reset it detected, at most
	// AutoReplayMaxWindow back (streamloss.go); with source
	// LogicalReplication, the rows created in that time before the window's
	// end.
	AutoReplay bool
	// AutoReplayMaxWindow bounds how far back an automatic replay goes;
	// default DefaultAutoReplayMaxWindow.
	AutoReplayMaxWindow time.Duration
	// Database names the database in log lines, password redacted.
	Database string
	// Logger receives structured logs; default slog.Default().
	Logger *slog.Logger
	// Metrics is where the relay counts; default a fresh, unregistered set.
	Metrics *Metrics

	// Ordering is the order promised; default OrderingNone.
	Ordering Ordering
	// LeaderTimeout is how soon a leader that stopped loses its leadership
	// (ordering Strict): its session's idle_session_timeout.
	LeaderTimeout time.Duration
	// StandbyPoll is how often an ordered relay rebalances its key
	// partitions (and a standby tries to become the leader).
	StandbyPoll time.Duration
	// Partitions is the number of key partitions of ordering PerKey: the
	// most relays that share the work; default DefaultPartitions. Every
	// relay of a table must use the same number.
	Partitions int
}

func (c Config) withDefaults() Config {
	c.Stream = cmp.Or(c.Stream, DefaultStream)
	c.DeadLetterStream = cmp.Or(c.DeadLetterStream, contract.DeadLetterStream(c.Stream))
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.BatchBytes = cmp.Or(c.BatchBytes, DefaultBatchBytes)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.BusyPollInterval = min(cmp.Or(c.BusyPollInterval, DefaultBusyPollInterval), c.PollInterval)
	c.InFlight = cmp.Or(c.InFlight, DefaultInFlight)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, DefaultPublishTimeout)
	c.MaxPayloadBytes = cmp.Or(c.MaxPayloadBytes, DefaultMaxPayloadBytes)
	c.MinBackoff = cmp.Or(c.MinBackoff, DefaultMinBackoff)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, DefaultMaxBackoff)
	c.MissingTableBackoff = cmp.Or(c.MissingTableBackoff, DefaultMissingTableBackoff)
	c.WaitTimeout = cmp.Or(c.WaitTimeout, DefaultWaitTimeout)
	c.StreamCheckInterval = cmp.Or(c.StreamCheckInterval, DefaultStreamCheckInterval)
	c.TableCheckInterval = cmp.Or(c.TableCheckInterval, DefaultTableCheckInterval)
	c.AutoReplayMaxWindow = cmp.Or(c.AutoReplayMaxWindow, DefaultAutoReplayMaxWindow)
	c.Trim = c.Trim.withDefaults()
	c.Ordering = cmp.Or(c.Ordering, OrderingNone)
	c.Source = cmp.Or(c.Source, SourcePolling)
	c.CatchUpMargin = cmp.Or(c.CatchUpMargin, DefaultCatchUpMargin)
	c.LeaderTimeout = cmp.Or(c.LeaderTimeout, DefaultLeaderTimeout)
	c.StandbyPoll = cmp.Or(c.StandbyPoll, DefaultStandbyPoll)
	c.Partitions = cmp.Or(c.Partitions, DefaultPartitions)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics()
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Table == nil {
		errs = append(errs, errors.New("table is required"))
	}
	if c.Stream == c.DeadLetterStream {
		errs = append(errs, fmt.Errorf("dead-letter stream must differ from the stream %q", c.Stream))
	}
	if c.BatchSize < 1 || c.BatchSize > MaxBatchSize {
		errs = append(errs, fmt.Errorf("batch size %d out of range 1..%d", c.BatchSize, MaxBatchSize))
	}
	if c.BatchBytes < MinBatchBytes {
		errs = append(errs, fmt.Errorf("batch bytes %d below %d", c.BatchBytes, MinBatchBytes))
	}
	if c.InFlight < 1 || c.InFlight > 8 {
		errs = append(errs, fmt.Errorf("in-flight batches %d out of range 1..8", c.InFlight))
	}
	if c.PollInterval < time.Millisecond {
		errs = append(errs, fmt.Errorf("poll interval %s below 1ms", c.PollInterval))
	}
	if c.PublishTimeout < time.Millisecond {
		errs = append(errs, fmt.Errorf("publish timeout %s below 1ms", c.PublishTimeout))
	}
	if c.MaxLen < 0 {
		errs = append(errs, fmt.Errorf("max len %d is negative", c.MaxLen))
	}
	if c.MaxPayloadBytes < 0 {
		errs = append(errs, fmt.Errorf("max payload bytes %d is negative", c.MaxPayloadBytes))
	}
	if _, err := ParseOrdering(string(c.Ordering)); err != nil {
		errs = append(errs, err)
	}
	if c.Ordering == OrderingPerKey && c.Table != nil && c.Table.Columns().Key == "" {
		errs = append(errs, errors.New("ordering PerKey needs a key column (--key-column)"))
	}
	if c.Partitions < 1 || c.Partitions > MaxPartitions {
		errs = append(errs, fmt.Errorf("partitions %d out of range 1..%d", c.Partitions, MaxPartitions))
	}
	if c.LeaderTimeout < time.Second {
		errs = append(errs, fmt.Errorf("leader timeout %s below 1s", c.LeaderTimeout))
	}
	if c.WaitReplicas < 0 {
		errs = append(errs, fmt.Errorf("wait replicas %d is negative", c.WaitReplicas))
	}
	if c.WaitReplicas > 0 && c.WaitTimeout >= c.PublishTimeout {
		errs = append(errs, fmt.Errorf("wait timeout %s must be below the publish timeout %s", c.WaitTimeout, c.PublishTimeout))
	}
	if err := c.validateSource(); err != nil {
		errs = append(errs, err)
	}
	if c.AutoReplay && c.Dispatch == outbox.DeleteOnDispatch {
		errs = append(errs, errors.New("auto-replay republishes dispatched rows, which cleanup mode OnDispatch deletes: "+
			"use one or the other"))
	}
	if err := c.Trim.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.MinBackoff > c.MaxBackoff {
		errs = append(errs, fmt.Errorf("min backoff %s above max backoff %s", c.MinBackoff, c.MaxBackoff))
	}
	return errors.Join(errs...)
}

// validateSource checks what source LogicalReplication needs and refuses
// what it cannot do.
func (c Config) validateSource() error {
	if _, err := ParseSource(string(c.Source)); err != nil {
		return err
	}
	if c.Source != SourceLogicalReplication {
		return nil
	}
	var errs []error
	if err := logical.ValidateSlot(c.Slot); err != nil {
		errs = append(errs, err)
	}
	if c.Replication == nil {
		errs = append(errs, errors.New("source LogicalReplication needs a replication connection config"))
	}
	if c.Dispatch == outbox.DeleteOnDispatch {
		errs = append(errs, errors.New("source LogicalReplication never touches the rows it streams: "+
			"cleanup mode OnDispatch applies to polling only (delete rows in the application, or by age with relay cleanup)"))
	}
	if c.Ordering == OrderingPerKey {
		errs = append(errs, errors.New("source LogicalReplication streams every event in commit order through one relay: "+
			"each key's events are in order already; use ordering None or Strict"))
	}
	return errors.Join(errs...)
}

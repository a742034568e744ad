package consumer

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	ioutbox "github.com/outbox-dev/outbox-operator/internal/outbox"
	"github.com/outbox-dev/outbox-operator/pkg/contract"
)

// Defaults of Config.
const (
	DefaultStream         = contract.DefaultStream
	DefaultGroup          = "workers"
	DefaultBatchSize      = 10
	DefaultBlock          = 2 * time.Second
	DefaultMinIdle        = time.Minute
	DefaultClaimInterval  = 15 * time.Second
	DefaultMaxDeliveries  = 5
	DefaultProcessedTable = "processed_events"
	DefaultHandlerTimeout = 30 * time.Second
	DefaultMinBackoff     = 100 * time.Millisecond
	DefaultMaxBackoff     = 10 * time.Second
	// MaxBatchSize bounds BatchSize.
	MaxBatchSize = 1000
	// MaxEventIDLength is the longest event_id accepted; longer ones are
	// dead-lettered, since they could not be indexed in the processed-events
	// table.
	MaxEventIDLength = 512
)

// EnvPodName is the environment variable the consumer name defaults to; a
// Kubernetes Deployment sets it from metadata.name (the downward API).
const EnvPodName = "POD_NAME"

// Config configures a Consumer. Zero values take the defaults above.
type Config struct {
	// Stream is the Redis stream to read.
	Stream string
	// Group is the consumer group; it is created (with MKSTREAM, reading
	// from the start of the stream) when missing.
	Group string
	// Consumer names this consumer within the group; default the
	// environment variable POD_NAME, else the host name. Two live consumers
	// must never share a name.
	Consumer string
	// Handler runs each new event; required.
	Handler Handler
	// BatchSize is the number of new entries read at once (pending ones
	// are reclaimed one at a time).
	BatchSize int
	// Block is how long one read waits for new entries.
	Block time.Duration
	// MinIdle is how long an entry stays pending before it is reclaimed:
	// from a consumer that died, or after a handler error. It must be longer
	// than the longest handler run (HandlerTimeout), or a slow entry is
	// reclaimed while it runs (harmless: the second run waits on the first's
	// processed-events row and then skips it, but it counts a delivery).
	MinIdle time.Duration
	// ClaimInterval is the time between two reclaim passes.
	ClaimInterval time.Duration
	// MaxDeliveries is the number of deliveries an entry gets before it is
	// dead-lettered (N in "failed N times").
	MaxDeliveries int
	// DeadLetterStream receives entries that failed MaxDeliveries times;
	// default Stream + ".dead".
	DeadLetterStream string
	// ProcessedTable is the processed-events table, optionally
	// schema-qualified; see ProcessedTableDDL.
	ProcessedTable string
	// HandlerTimeout bounds one entry: the handler and the transaction
	// around it. A handler that runs out of time has failed.
	HandlerTimeout time.Duration
	// MinBackoff and MaxBackoff bound the delay before retrying after a
	// Redis or PostgreSQL error.
	MinBackoff, MaxBackoff time.Duration
	// Logger receives structured logs; default slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults(getenv func(string) string, hostname func() (string, error)) Config {
	c.Stream = cmp.Or(c.Stream, DefaultStream)
	c.Group = cmp.Or(c.Group, DefaultGroup)
	if c.Consumer == "" {
		c.Consumer = defaultConsumerName(getenv, hostname)
	}
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Block = cmp.Or(c.Block, DefaultBlock)
	c.MinIdle = cmp.Or(c.MinIdle, DefaultMinIdle)
	c.ClaimInterval = cmp.Or(c.ClaimInterval, DefaultClaimInterval)
	c.MaxDeliveries = cmp.Or(c.MaxDeliveries, DefaultMaxDeliveries)
	c.DeadLetterStream = cmp.Or(c.DeadLetterStream, contract.DeadLetterStream(c.Stream))
	c.ProcessedTable = cmp.Or(c.ProcessedTable, DefaultProcessedTable)
	c.HandlerTimeout = cmp.Or(c.HandlerTimeout, DefaultHandlerTimeout)
	c.MinBackoff = cmp.Or(c.MinBackoff, DefaultMinBackoff)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, DefaultMaxBackoff)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// defaultConsumerName is POD_NAME, else the host name, else "".
func defaultConsumerName(getenv func(string) string, hostname func() (string, error)) string {
	if name := getenv(EnvPodName); name != "" {
		return name
	}
	if name, err := hostname(); err == nil {
		return name
	}
	return ""
}

func (c Config) validate() error {
	var errs []error
	if c.Handler == nil {
		errs = append(errs, errors.New("a handler is required"))
	}
	if c.Consumer == "" {
		errs = append(errs, fmt.Errorf("no consumer name: set one, or %s", EnvPodName))
	}
	if c.Stream == c.DeadLetterStream {
		errs = append(errs, fmt.Errorf("dead-letter stream must differ from the stream %q", c.Stream))
	}
	if c.BatchSize < 1 || c.BatchSize > MaxBatchSize {
		errs = append(errs, fmt.Errorf("batch size %d out of range 1..%d", c.BatchSize, MaxBatchSize))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"block", c.Block}, {"min idle", c.MinIdle}, {"claim interval", c.ClaimInterval},
		{"handler timeout", c.HandlerTimeout}, {"min backoff", c.MinBackoff},
	} {
		if d.v < time.Millisecond {
			errs = append(errs, fmt.Errorf("%s %s below 1ms", d.name, d.v))
		}
	}
	if c.MaxDeliveries < 1 {
		errs = append(errs, fmt.Errorf("max deliveries %d below 1", c.MaxDeliveries))
	}
	if c.MinBackoff > c.MaxBackoff {
		errs = append(errs, fmt.Errorf("min backoff %s above max backoff %s", c.MinBackoff, c.MaxBackoff))
	}
	if _, err := quoteTable(c.ProcessedTable); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// quoteTable validates a table name, optionally schema-qualified, and
// quotes it.
func quoteTable(name string) (string, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("processed table %q: %w: at most schema.table", name, ioutbox.ErrInvalidIdentifier)
	}
	for _, p := range parts {
		if err := ioutbox.ValidateIdentifier("processed table", p); err != nil {
			return "", err
		}
	}
	return pgx.Identifier(parts).Sanitize(), nil
}

// realEnv is the process environment.
var realEnv = struct {
	getenv   func(string) string
	hostname func() (string, error)
}{os.Getenv, os.Hostname}

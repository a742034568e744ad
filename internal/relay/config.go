package relay

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/outbox-dev/outbox-operator/internal/outbox"
)

// Defaults of Config.
const (
	DefaultStream           = "jobs"
	DefaultBatchSize        = 500
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
)

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
	// PollInterval is the pause after a pass that found nothing.
	PollInterval time.Duration
	// BusyPollInterval is the shorter pause after a pass that found rows
	// but not a full batch: while events flow, the relay polls often, so
	// latency stays low without the NOTIFY trigger; once the outbox is idle
	// it falls back to PollInterval. Capped at PollInterval.
	BusyPollInterval time.Duration
	// InFlight is the number of batches in flight at once, each in its own
	// transaction: with 2, the next batch is claimed while the previous one
	// is published and committed. Claims are made one at a time and batches
	// are published in the order they were claimed, so the stream keeps
	// created_at order either way (barring a failed batch, which is
	// republished later). 1 makes the relay strictly sequential.
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
	// Database names the database in log lines, password redacted.
	Database string
	// Logger receives structured logs; default slog.Default().
	Logger *slog.Logger
	// Metrics is where the relay counts; default a fresh, unregistered set.
	Metrics *Metrics
}

func (c Config) withDefaults() Config {
	c.Stream = cmp.Or(c.Stream, DefaultStream)
	c.DeadLetterStream = cmp.Or(c.DeadLetterStream, c.Stream+".dead")
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.BusyPollInterval = min(cmp.Or(c.BusyPollInterval, DefaultBusyPollInterval), c.PollInterval)
	c.InFlight = cmp.Or(c.InFlight, DefaultInFlight)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, DefaultPublishTimeout)
	c.MaxPayloadBytes = cmp.Or(c.MaxPayloadBytes, DefaultMaxPayloadBytes)
	c.MinBackoff = cmp.Or(c.MinBackoff, DefaultMinBackoff)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, DefaultMaxBackoff)
	c.MissingTableBackoff = cmp.Or(c.MissingTableBackoff, DefaultMissingTableBackoff)
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
	if c.MinBackoff > c.MaxBackoff {
		errs = append(errs, fmt.Errorf("min backoff %s above max backoff %s", c.MinBackoff, c.MaxBackoff))
	}
	return errors.Join(errs...)
}

package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/outbox-dev/outbox-operator/internal/relay"
)

// streamOptions are the flags of `relay run` about what Redis keeps:
// waiting for replicas, trimming, stream resets (docs/relay.md).
type streamOptions struct {
	waitReplicas        int
	waitTimeout         time.Duration
	trim                relay.TrimPolicy
	streamCheckInterval time.Duration
	autoReplay          bool
	autoReplayMaxWindow time.Duration
}

func (s *streamOptions) addFlags(fs *pflag.FlagSet) {
	fs.IntVar(&s.waitReplicas, "wait-replicas", 0,
		"WAIT for this many replicas to acknowledge each batch before its commit; "+
			"fewer roll it back and retry (error kind redis_replicas); 0: no wait")
	fs.DurationVar(&s.waitTimeout, "wait-timeout", relay.DefaultWaitTimeout,
		"how long a batch waits for --wait-replicas (below --publish-timeout)")
	fs.Int64Var(&s.trim.MaxLen, "trim-max-len", 0,
		"trim the stream to about this many entries, never past an entry a consumer group has not acknowledged, "+
			"nor a stream without groups (XTRIM MINID); 0: no length bound")
	fs.DurationVar(&s.trim.MaxAge, "trim-max-age", 0,
		"trim stream entries older than this, never past an entry a consumer group has not acknowledged; 0: no age bound")
	fs.DurationVar(&s.trim.Interval, "trim-interval", relay.DefaultTrimInterval, "time between two trims")
	fs.DurationVar(&s.streamCheckInterval, "stream-check-interval", relay.DefaultStreamCheckInterval,
		"how often the stream is checked for a reset between batches (every batch checks it too)")
	fs.BoolVar(&s.autoReplay, "auto-replay", false,
		"republish by itself the rows dispatched in the window of a stream reset it detects (at most --auto-replay-max-window back)")
	fs.DurationVar(&s.autoReplayMaxWindow, "auto-replay-max-window", relay.DefaultAutoReplayMaxWindow,
		"how far back an automatic replay goes at most (match the cleanup retention)")
	_ = fs.MarkDeprecated("max-len", "XADD MAXLEN ~ drops entries a slow consumer group has not read yet; use --trim-max-len")
}

func (s *streamOptions) validate(publishTimeout time.Duration) error {
	var errs []error
	if s.waitReplicas < 0 {
		errs = append(errs, fmt.Errorf("--wait-replicas %d: must be 0 (off) or positive", s.waitReplicas))
	}
	if s.waitReplicas > 0 && (s.waitTimeout <= 0 || s.waitTimeout >= publishTimeout) {
		errs = append(errs, fmt.Errorf("--wait-timeout %s: must be positive and below --publish-timeout %s", s.waitTimeout, publishTimeout))
	}
	if s.trim.MaxLen < 0 || s.trim.MaxAge < 0 {
		errs = append(errs, errors.New("--trim-max-len and --trim-max-age must be 0 (off) or positive"))
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"--trim-interval", s.trim.Interval},
		{"--stream-check-interval", s.streamCheckInterval},
		{"--auto-replay-max-window", s.autoReplayMaxWindow},
	} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s %s: must be positive", d.flag, d.v))
		}
	}
	return errors.Join(errs...)
}

// apply sets the relay's configuration from the flags.
func (s *streamOptions) apply(cfg *relay.Config) {
	cfg.WaitReplicas, cfg.WaitTimeout = s.waitReplicas, s.waitTimeout
	cfg.Trim = s.trim
	cfg.StreamCheckInterval = s.streamCheckInterval
	cfg.AutoReplay, cfg.AutoReplayMaxWindow = s.autoReplay, s.autoReplayMaxWindow
}

package relay

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// triggerRecheck is how often the listener looks again for a NOTIFY trigger
// that was missing.
const triggerRecheck = time.Minute

// listen wakes the relay on NOTIFY from the table's trigger, when the
// trigger exists. Polling goes on regardless; this only cuts latency. It
// holds one connection of its own and returns when ctx is done.
func (r *Relay) listen(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		installed, err := r.cfg.Table.HasNotifyTrigger(ctx, r.db)
		if err != nil || !installed {
			sleep(ctx, triggerRecheck, nil)
			continue
		}
		if err := r.listenOnce(ctx); err != nil && ctx.Err() == nil {
			failures++
			r.log.Debug("NOTIFY listener lost its connection, polling meanwhile", "error", err.Error())
			sleep(ctx, backoff(failures, r.cfg.MinBackoff, r.cfg.MaxBackoff, jitter), nil)
			continue
		}
		failures = 0
	}
}

func (r *Relay) listenOnce(ctx context.Context) error {
	conn, err := r.db.Acquire(ctx)
	if err != nil {
		return err
	}
	// A connection that has run LISTEN must not return to the pool.
	pc := conn.Hijack()
	defer func() { _ = pc.Close(context.WithoutCancel(ctx)) }()
	if _, err := pc.Exec(ctx, "LISTEN "+pgx.Identifier{r.cfg.Table.Channel()}.Sanitize()); err != nil {
		return err
	}
	r.log.Info("Listening for NOTIFY", "channel", r.cfg.Table.Channel())
	r.signal() // rows may have arrived while we were not listening
	for {
		if _, err := pc.WaitForNotification(ctx); err != nil {
			return err
		}
		r.signal()
	}
}

// signal wakes the loop without blocking; one pending wake-up is enough.
func (r *Relay) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

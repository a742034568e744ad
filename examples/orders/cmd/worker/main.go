// Command worker is the consumer of the sample application: it reads the
// outbox stream with a consumer group (package pkg/consumer) and, for each
// order_created event, sends the confirmation email exactly once: the log
// line
//
//	sending confirmation email for order <order_id> to <customer_email>
//
// and a row in sent_emails, written in the transaction that records the
// event as processed. Other event types are acknowledged and ignored.
//
// Connection strings come from the environment only (DATABASE_URL,
// REDIS_URL), as for the relay; the consumer name defaults to POD_NAME, then
// the host name. /healthz and /readyz are served on
// --health-probe-bind-address. SIGTERM finishes the entries in flight, then
// exits 0.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := newRootCommand(os.Getenv, nil).ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

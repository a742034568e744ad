// Command relay moves transactional-outbox rows from PostgreSQL into a Redis
// stream, and keeps the outbox table in shape.
//
//	relay run      claim, publish, commit, in a loop (the relay Deployment)
//	relay cleanup  delete dispatched rows older than the retention (the CronJob)
//	relay backlog  print the count of undispatched rows and the oldest
//	relay schema   print (or --apply) the table, its partial index and trigger
//
// Secrets come from the environment only (DATABASE_URL, REDIS_URL); every
// other setting is a flag that can also be set as RELAY_<FLAG_NAME>.
// docs/relay-cli.md is the reference.
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
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(1)
	}
}

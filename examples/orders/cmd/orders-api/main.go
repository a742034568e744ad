// Command orders-api is the HTTP API of the sample application: it creates
// orders, each with its order_created outbox row in the same transaction.
//
//	orders-api           serve POST /orders, GET /orders/{id}, /healthz, /readyz on --bind-address
//	orders-api migrate   create the schema: orders, the outbox table and its partial index,
//	                     processed_events, sent_emails (idempotent)
//
// The connection string comes from the environment only (DATABASE_URL), as
// for the relay. docs/sample.md runs it on a cluster.
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
		fmt.Fprintln(os.Stderr, "orders-api:", err)
		os.Exit(1)
	}
}

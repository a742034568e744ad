// Command kubectl-outbox is the kubectl plugin of the outbox-operator:
// `kubectl outbox status|doctor|backlog|cleanup|dead-letters|replay|pause|resume`.
// The commands that need PostgreSQL or Redis run the relay binary in the
// cluster, as a short-lived pod built the way the operator builds relay pods
// (the OutboxRelay's image, Secrets and layout), so that the person who runs
// them needs RBAC on pods, not the credentials. docs/kubectl-plugin.md
// describes every command.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCommand().ExecuteContext(ctx)
	stop()
	if err == nil {
		return
	}
	var exit *exitError
	if errors.As(err, &exit) {
		if exit.msg != "" {
			_, _ = fmt.Fprintln(os.Stderr, "kubectl outbox:", exit.msg)
		}
		os.Exit(exit.code)
	}
	_, _ = fmt.Fprintln(os.Stderr, "kubectl outbox:", err)
	os.Exit(1)
}

// exitError ends the plugin with the exit code of the relay command it ran
// (msg, when set, is printed first).
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string {
	if e.msg != "" {
		return e.msg
	}
	return fmt.Sprintf("exit status %d", e.code)
}

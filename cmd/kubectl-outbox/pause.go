package main

import (
	"fmt"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// newPauseCommand is `pause` (pause true) or `resume`: they set and clear
// spec.suspend, the switch the operator itself honours by scaling the relays
// to 0 while it goes on measuring the backlog and reporting (docs/kubectl-plugin.md
// says why not a reconcile pause).
func newPauseCommand(p *plugin, pause bool) *cobra.Command {
	use, short, example := "resume", "Resume an OutboxRelay: clear spec.suspend, the relays come back and drain the backlog",
		"  kubectl outbox resume orders"
	if pause {
		use, short, example = "pause", "Pause an OutboxRelay: set spec.suspend, the relays scale to 0 and rows stay in the outbox",
			"  kubectl outbox pause orders\n  kubectl outbox pause orders -n shop"
	}
	return &cobra.Command{
		Use:   use + " NAME",
		Short: short,
		Long: short + `.

pause sets spec.suspend: true; the operator scales the relay Deployment to 0 (Ready
False, reason Suspended) and keeps measuring the backlog, so the status and the alerts
stay live and nothing is lost: committed rows wait in the outbox. resume sets it back to
false. Neither stops the operator from reconciling the OutboxRelay: a change of spec still
takes effect. Prints what changed, or that nothing did.`,
		Example:           example,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: p.completeRelayNames,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			relay, err := p.relay(ctx, args[0])
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if relay.Spec.Suspend == pause {
				_, err := fmt.Fprintf(w, "outboxrelay %s/%s: spec.suspend is already %t; nothing changed\n", relay.Namespace, relay.Name, pause)
				return err
			}
			patch := fmt.Appendf(nil, `{"spec":{"suspend":%t}}`, pause)
			err = p.client.Patch(ctx, relay, client.RawPatch("application/merge-patch+json", patch))
			if apierrors.IsForbidden(err) {
				return fmt.Errorf("not allowed to patch outboxrelay %q in namespace %q (%s sets spec.suspend: it needs patch on outboxrelays): %w",
					relay.Name, relay.Namespace, use, err)
			}
			if err != nil {
				return fmt.Errorf("patching outboxrelay %s/%s: %w", relay.Namespace, relay.Name, err)
			}
			what := "the relays scale to 0; rows wait in the outbox"
			if !pause {
				what = "the relays come back and drain the backlog"
			}
			_, err = fmt.Fprintf(w, "outboxrelay %s/%s %sd: spec.suspend %t -> %t (%s)\n", relay.Namespace, relay.Name, use, !pause, pause, what)
			return err
		},
	}
}

package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/outbox-dev/outbox-operator/api/v1alpha1"
)

// plugin holds the kubectl flags (--kubeconfig, --context, -n, ...) and the
// clients built from them.
type plugin struct {
	flags *genericclioptions.ConfigFlags

	namespace string
	client    client.Client
	pods      kubernetes.Interface
}

func newRootCommand() *cobra.Command {
	p := &plugin{flags: genericclioptions.NewConfigFlags(true)}
	root := &cobra.Command{
		Use:   "kubectl-outbox",
		Short: "Day-2 operations of OutboxRelays from kubectl, without database credentials on your machine",
		Long: `kubectl outbox shows an OutboxRelay at a glance and runs the relay's operational
commands (doctor, backlog, cleanup, dead-letters, replay) inside the cluster, as a
short-lived pod in the OutboxRelay's namespace built the way the operator builds
relay pods: its image, its Secrets (as secretKeyRef environment variables), its table
layout and the restricted security context. The pod's output is streamed back, its
exit status becomes this command's, and the pod is deleted afterwards (also on Ctrl-C).
You need RBAC to get OutboxRelays and Deployments and to create, get and delete pods
(and pods/log) in that namespace; never the credentials themselves.`,
		Example: `  kubectl outbox status                 # every OutboxRelay of the namespace
  kubectl outbox status orders          # one, with its conditions and the stream's consumer groups
  kubectl outbox doctor orders          # the relay's preflight checks, run in the cluster
  kubectl outbox dead-letters list orders
  kubectl outbox pause orders`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// kubectl runs it as `kubectl outbox`: usage lines say so.
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl outbox"},
	}
	p.flags.AddFlags(root.PersistentFlags())
	root.AddCommand(
		newStatusCommand(p),
		newDoctorCommand(p),
		newBacklogCommand(p),
		newCleanupCommand(p),
		newDeadLettersCommand(p),
		newReplayCommand(p),
		newPauseCommand(p, true),
		newPauseCommand(p, false),
	)
	return root
}

// connect builds the clients from the kubectl flags.
func (p *plugin) connect() error {
	if p.client != nil {
		return nil
	}
	cfg, err := p.flags.ToRESTConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	ns, _, err := p.flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return fmt.Errorf("namespace: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("connecting to the cluster: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("connecting to the cluster: %w", err)
	}
	p.namespace, p.client, p.pods = ns, c, cs
	return nil
}

// relay gets one OutboxRelay of the namespace, with a message that says what
// to do when it is not there.
func (p *plugin) relay(ctx context.Context, name string) (*v1alpha1.OutboxRelay, error) {
	if err := p.connect(); err != nil {
		return nil, err
	}
	r := &v1alpha1.OutboxRelay{}
	err := p.client.Get(ctx, client.ObjectKey{Namespace: p.namespace, Name: name}, r)
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("outboxrelay %q not found in namespace %q (kubectl get outboxrelays -n %s lists them)",
			name, p.namespace, p.namespace)
	case apierrors.IsForbidden(err):
		return nil, fmt.Errorf("not allowed to read outboxrelay %q in namespace %q: %w", name, p.namespace, err)
	case err != nil:
		return nil, fmt.Errorf("getting outboxrelay %s/%s: %w", p.namespace, name, err)
	}
	return r, nil
}

// completeRelayNames completes the first argument with the names of the
// OutboxRelays of the namespace (-n and --context are honoured).
func (p *plugin) completeRelayNames(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	if err := p.connect(); err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	var list v1alpha1.OutboxRelayList
	if err := p.client.List(cmd.Context(), &list, client.InNamespace(p.namespace)); err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	var names []string
	for _, r := range list.Items {
		if strings.HasPrefix(r.Name, toComplete) {
			names = append(names, r.Name)
		}
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}

/*
Copyright 2026 The outbox-operator Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

// Command manager is the outbox-operator: a controller-runtime manager that
// reconciles OutboxRelays (relay.outbox.dev/v1alpha1) into relay Deployments
// and cleanup CronJobs, scaled by the backlog of their outbox tables.
//
// It runs in a cluster (config/default) or, for development, against the
// cluster of the current kubeconfig (`go run ./cmd/manager`). See
// docs/controller.md for the flags.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/debug"

	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/outbox-dev/outbox-operator/internal/controller"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	err := run(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		os.Exit(1)
	}
}

// run parses the flags, builds the manager and runs it until a signal.
func run(args []string) error {
	opts, err := parseFlags(args, os.Getenv)
	if err != nil {
		return err
	}
	logger, err := newLogger(opts.logLevel, opts.logFormat, os.Stderr)
	if err != nil {
		return err
	}
	ctrl.SetLogger(logger)
	klog.SetLogger(logger)
	log := logger.WithName("setup")
	memLimit, err := softMemoryLimit(os.Getenv, os.DirFS("/"))
	if err != nil {
		log.Error(err, "Found no usable memory limit; running without a soft memory limit")
	}
	if memLimit.Bytes > 0 {
		debug.SetMemoryLimit(memLimit.Bytes)
	}

	cfg, err := restConfig(opts)
	if err != nil {
		return fmt.Errorf("loading the kubeconfig: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, managerOptions(opts))
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}

	relayMetrics := controller.NewRelayMetrics()
	if err := metrics.Registry.Register(relayMetrics); err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()
	r := &controller.OutboxRelayReconciler{
		Client:                  mgr.GetClient(),
		APIReader:               mgr.GetAPIReader(),
		Scheme:                  mgr.GetScheme(),
		Recorder:                mgr.GetEventRecorder("outbox-operator"),
		RelayImage:              opts.relayImage,
		Pools:                   opts.pools,
		Checks:                  opts.checks,
		Metrics:                 relayMetrics,
		MaxConcurrentReconciles: opts.maxConcurrentReconciles,
	}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the OutboxRelay controller: %w", err)
	}
	if err := metrics.Registry.Register(r.ProbeCollector()); err != nil {
		return fmt.Errorf("registering the backlog prober's metrics: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding the health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("adding the readiness check: %w", err)
	}

	log.Info("Starting manager", "version", version, "relayImage", opts.relayImage,
		"watchNamespaces", opts.watchNamespaces, "leaderElection", opts.leaderElect,
		"maxConcurrentReconciles", opts.maxConcurrentReconciles,
		"memoryLimit", memoryLimitString(debug.SetMemoryLimit(-1)), "memoryLimitSource", memLimit.Source)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running the manager: %w", err)
	}
	return nil
}

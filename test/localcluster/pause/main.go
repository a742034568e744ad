// Command pause is the local cluster's sandbox image: the process that holds
// a pod's namespaces, as Kubernetes' pause image does. It waits for SIGTERM
// or SIGINT and exits 0. It is built from this repo and packed into an image
// on the machine (test/localcluster/kubelet), because no registry can be
// reached to pull the upstream one.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		_, _ = os.Stdout.WriteString("pause (outbox-operator local cluster)\n")
		return
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	// As PID 1 of a shared PID namespace it would reap orphans; the local
	// cluster's pods do not share one, so SIGCHLD is left to the default.
	<-sig
}

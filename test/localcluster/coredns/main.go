// Command coredns is the local cluster's cluster DNS: CoreDNS built from its
// Go module with the few plugins a cluster's DNS needs (kubernetes, cache,
// errors, health, ready, loadbalance, log), as a static binary that package
// cluster packs into an image for the real node. It is a module of its own,
// outside the workspace (go.work), so that CoreDNS's dependencies never
// reach the product's or the tests' module graphs; hack/setup-envtest.sh
// --with-node builds it with GOWORK=off.
//
// The plugins register themselves when imported; CoreDNS's own build lists
// them all in core/plugin, which would compile every cloud provider's SDK.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() { coremain.Run() }

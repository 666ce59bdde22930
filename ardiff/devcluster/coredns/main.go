// CoreDNS with the plugins the dev cluster's Corefile uses, the way CoreDNS documents custom builds: coremain
// with a chosen directive list (upstream's plugin.cfg order) instead of all of them, so that the build does
// not compile every cloud provider's SDK.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"log", "health", "ready", "errors", "cache", "loadbalance", "kubernetes"}
}

func main() {
	coremain.Run()
}

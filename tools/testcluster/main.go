// Command testcluster is a real Kubernetes control plane in one binary, for pd-operator's tests,
// benchmarks and demo: `testcluster <component> [flags]` runs one component in this process.
//
// Components: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok, and the real
// node's kubelet and NPU device plugin stand-in (npu.go; tests/support/node.py runs them next to the
// containerd node.sh builds).
//
// Why one binary of our own: k8s.io/kubernetes cannot be `go install`ed (its go.mod replaces the
// staging modules with local paths), so this module imports the components' `app` packages with
// every staging module pinned to its published k8s.io/X v0.36.3 (see go.mod and gen-replace.sh).
// Linking them together shares the dependency graph, so the cold build compiles it once.
// Each component still runs in its own process (tests/support/cluster.py starts five).
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	_ "time/tzdata" // CronJob time zones, as the upstream kube-apiserver and controller-manager mains do

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric

	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

var components = map[string]func(){
	"etcd": func() {
		// etcdmain.Main reads args[1] itself (gateway/grpc-proxy); args[0] is the program name.
		etcdmain.Main(os.Args)
	},
	"kube-apiserver": func() { os.Exit(cli.Run(apiserver.NewAPIServerCommand())) },
	"kube-controller-manager": func() {
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	},
	"kube-scheduler":    func() { os.Exit(cli.Run(scheduler.NewSchedulerCommand())) },
	"kwok":              runKwok,
	"kubelet":           func() { os.Exit(cli.Run(kubelet.NewKubeletCommand(context.Background()))) },
	"npu-device-plugin": runNPUDevicePlugin,
}

func usage() {
	names := make([]string, 0, len(components))
	for name := range components {
		names = append(names, name)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: %s {%s} [flags]\n", os.Args[0], strings.Join(names, "|"))
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	run, ok := components[os.Args[1]]
	if !ok {
		usage()
		os.Exit(2)
	}
	// Every component parses os.Args (cobra, pflag, etcd's own parser): drop our dispatch word so
	// each sees exactly the command line its own binary would.
	os.Args = append([]string{os.Args[1]}, os.Args[2:]...)
	run()
}

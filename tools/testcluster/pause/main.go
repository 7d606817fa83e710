// Command pause is the sandbox image's only process on the real node (tests/support/node.py): it
// holds a pod's namespaces open until the runtime stops it, as registry.k8s.io/pause does, and reaps
// the pod's orphaned children when it is the pid namespace's init.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

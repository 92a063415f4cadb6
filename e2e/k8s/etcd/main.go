// Command etcd runs the etcd server from go.etcd.io/etcd/server/v3, for the
// end-to-end test control plane (built by ../build.sh).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}

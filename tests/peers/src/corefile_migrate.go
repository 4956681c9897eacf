// corefile-migrate: what kubeadm does to a customised Corefile when it upgrades CoreDNS
// (migration.Migrate(from, to, corefile, false)), reading the Corefile on stdin and printing the result.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/coredns/corefile-migration/migration"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: corefile-migrate FROM_VERSION TO_VERSION < Corefile")
		os.Exit(2)
	}
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out, err := migration.Migrate(os.Args[1], os.Args[2], string(in), false)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Print(out)
}

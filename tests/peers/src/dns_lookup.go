// dns-lookup resolves names the way a program in a pod does when it names no DNS server: through the pod's
// /etc/resolv.conf (the kubelet writes the cluster DNS, the search list and ndots there), with Go's own resolver,
// which reads that file as the C library does. It prints the file's nameserver lines first ("nameserver ADDR":
// what the pod was given, not chosen), then one line per name: "NAME ADDR[,ADDR...]" with the IPv4 addresses
// sorted, or "NAME error WHY". It exits 0 once every name resolved, 1 otherwise, so a pod with
// `restartPolicy: OnFailure` retries until the cluster DNS answers.
//
// Usage: dns-lookup NAME...
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dns-lookup NAME...")
		os.Exit(2)
	}
	if conf, err := os.ReadFile("/etc/resolv.conf"); err == nil {
		for _, line := range strings.Split(string(conf), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "nameserver") {
				fmt.Println(strings.Join(strings.Fields(line), " "))
			}
		}
	}
	resolver := &net.Resolver{PreferGo: true}
	failed := false
	for _, name := range os.Args[1:] {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		addrs, err := resolver.LookupIP(ctx, "ip4", name)
		cancel()
		if err != nil {
			failed = true
			fmt.Printf("%s error %v\n", name, err)
			continue
		}
		var out []string
		for _, a := range addrs {
			out = append(out, a.String())
		}
		sort.Strings(out)
		fmt.Printf("%s %s\n", name, strings.Join(out, ","))
	}
	if failed {
		os.Exit(1)
	}
}

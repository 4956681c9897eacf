// http-probe GET-s a URL with no credentials at all (no Authorization header, no client certificate), trusting
// only the CA file given, and prints the status code on the first line and the body after it. kubectl cannot
// make such a request: with no credentials in its kubeconfig it prompts for a username and password.
//
// Usage: http-probe -ca FILE URL
package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	caFile := flag.String("ca", "", "PEM file of the CAs to trust (required)")
	flag.Parse()
	if *caFile == "" || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: http-probe -ca FILE URL")
		os.Exit(2)
	}
	pem, err := os.ReadFile(*caFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		fmt.Fprintf(os.Stderr, "%s holds no PEM certificate\n", *caFile)
		os.Exit(1)
	}
	client := &http.Client{
		Timeout:   20 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	resp, err := client.Get(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	fmt.Printf("%d\n%s", resp.StatusCode, body)
}

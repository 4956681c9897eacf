// kubeconfig-probe uses a kubeconfig file the way a hub that reloads its mounted kubeconfig would: it POSTs a
// SelfSubjectReview to its current context's server every -every over a new TLS connection (no keep-alive: a
// connection made with an old certificate would hide that certificate's expiry), with the client certificate and
// key and the CA the file holds, or the CA of the -ca file when one is given. The host is resolved by Go's own
// resolver from the pod's /etc/resolv.conf and /etc/hosts (the default resolver of a static Go program). -server
// https://HOST:PORT sends to that host instead, keeping the kubeconfig server's path. It counts requests and
// failures; a request fails unless it is answered 201 naming the expected user.
//
// What it reads, and when (-reload):
//
//	request  every file before every request (the default);
//	change   the kubeconfig again whenever the file changed (the kubelet swaps a mounted Secret's files
//	         atomically); the -ca file only on SIGHUP (what the ca-syncer sidecar sends);
//	once     both at start only (a read-once consumer, which a restart reloads); SIGHUP still reloads both.
//
// It prints one line per failure ("fail <n> <class> <why>", class one of resolution, connect, tls, timeout, 401,
// 403, 5xx, http (another status), user (another user), config (the files); with "(the client certificate ended
// at <RFC 3339>)" when it was used past its notAfter: a renewal that reached the file too late, not a refused
// valid one), one line whenever the client certificate changes ("cert <serial> notAfter <RFC 3339>"), one
// whenever the server's certificate changes ("server <serial> authorityKeyId <aa:bb:..>", its issuer's key), one
// whenever a file was read again with new content ("reload <what>"), and a summary line every second ("requests
// <n> failures <n> certs <n>", also at SIGTERM), so the last summary line of its log says how it went.
// openssl-probe prints the same lines. Before its first request it waits until the files can be read and the
// server's name resolves ("ready after <n> check(s)"), as a hub waits for its configuration: nothing is counted
// before.
//
// The kubeconfig is parsed for exactly what it needs (current-context, its context's cluster and user, their
// server, certificate-authority-data, client-certificate-data and client-key-data) by a reader of the block
// YAML kubeconfig writers emit; anything else in the file is ignored.
//
// Usage: kubeconfig-probe -kubeconfig FILE -user NAME [-ca FILE] [-server https://HOST:PORT] [-every 200ms]
// [-reload request|change|once]
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// failure is an error with its class.
type failure struct {
	class string
	err   error
}

func (f failure) Error() string { return f.err.Error() }

func classed(class string, err error) error { return failure{class, err} }

// classOf names what kind of failure err is.
func classOf(err error) string {
	var f failure
	if errors.As(err, &f) {
		return f.class
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return "resolution"
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return "timeout"
	}
	var verify *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	var record tls.RecordHeaderError
	var alert tls.AlertError
	if errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) ||
		errors.As(err, &invalid) || errors.As(err, &record) || errors.As(err, &alert) ||
		strings.Contains(err.Error(), "tls: ") {
		return "tls"
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return "connect"
	}
	return "connect"
}

type state struct {
	file, caFile, server string
	k                    kubeconfig
	ca                   []byte
	client               *http.Client
	leaf                 *x509.Certificate
	stamp                os.FileInfo
	lastServer           string
}

func main() {
	file := flag.String("kubeconfig", "", "the kubeconfig file (required)")
	user := flag.String("user", "", "the username the SelfSubjectReview must report (required)")
	every := flag.Duration("every", 200*time.Millisecond, "how often to make a request")
	caFile := flag.String("ca", "", "trust this CA file instead of the kubeconfig's certificate-authority-data")
	server := flag.String("server", "", "send to this https://HOST:PORT instead, keeping the kubeconfig server's path")
	reload := flag.String("reload", "request", "when to read the files again: request, change or once")
	flag.Parse()
	if *file == "" || *user == "" || (*reload != "request" && *reload != "change" && *reload != "once") {
		fmt.Fprintln(os.Stderr, "usage: kubeconfig-probe -kubeconfig FILE -user NAME [-ca FILE] [-server https://HOST:PORT] [-every 200ms] [-reload request|change|once]")
		os.Exit(2)
	}
	var hup, term atomic.Bool
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGHUP, syscall.SIGTERM)
	go func() {
		for sig := range signals {
			if sig == syscall.SIGTERM {
				term.Store(true)
			} else {
				hup.Store(true)
			}
		}
	}()
	s := &state{file: *file, caFile: *caFile, server: *server}
	// Start-up: wait until the files can be read and the server's name resolves, as a hub waits for its
	// configuration; nothing is counted before.
	for checks := 1; ; checks++ {
		if ready(*file, *caFile, *server) {
			fmt.Printf("ready after %d check(s)\n", checks)
			break
		}
		if term.Load() {
			return
		}
		if checks == 1 {
			fmt.Println("waiting for the files and the server's name")
		}
		time.Sleep(100 * time.Millisecond)
	}
	var requests, failures, certs int
	lastCert := ""
	lastSummary := time.Now()
	first := true
	for tick := time.NewTicker(*every); ; <-tick.C {
		requests++
		signalled := hup.Swap(false)
		readKube := first || *reload == "request" || signalled || s.client == nil
		if *reload == "change" && !readKube {
			info, err := os.Stat(*file)
			readKube = err != nil || s.stamp == nil || !sameFile(info, s.stamp)
		}
		readCA := *caFile != "" && (first || *reload == "request" || signalled || s.ca == nil)
		first = false
		err := s.load(readKube, readCA, signalled)
		if err == nil {
			err = s.probe(*user)
		}
		if s.leaf != nil {
			cert := fmt.Sprintf("cert %s notAfter %s", s.leaf.SerialNumber.Text(16), s.leaf.NotAfter.UTC().Format(time.RFC3339))
			if cert != lastCert {
				certs++
				lastCert = cert
				fmt.Println(cert)
			}
		}
		if err != nil {
			failures++
			fmt.Printf("fail %d %s %v\n", requests, classOf(err), err)
		}
		if term.Load() || time.Since(lastSummary) >= time.Second {
			lastSummary = time.Now()
			fmt.Printf("requests %d failures %d certs %d\n", requests, failures, certs)
		}
		if term.Load() {
			return
		}
	}
}

// ready says whether the files can be read and the server's name resolves.
func ready(file, caFile, server string) bool {
	text, err := os.ReadFile(file)
	if err != nil {
		return false
	}
	k, err := parseKubeconfig(string(text))
	if err != nil {
		return false
	}
	if caFile != "" {
		if _, err := os.ReadFile(caFile); err != nil {
			return false
		}
	}
	if server != "" {
		if k.server, err = override(k.server, server); err != nil {
			return false
		}
	}
	u, err := url.Parse(k.server)
	if err != nil {
		return false
	}
	_, err = net.DefaultResolver.LookupHost(context.Background(), u.Hostname())
	return err == nil
}

func sameFile(a, b os.FileInfo) bool {
	return os.SameFile(a, b) && a.Size() == b.Size() && a.ModTime().Equal(b.ModTime())
}

// load reads what is due and, when anything changed, builds a new client from it.
func (s *state) load(readKube, readCA, signalled bool) error {
	changed := false
	how := ""
	if signalled {
		how = " (SIGHUP)"
	}
	if readKube {
		info, statErr := os.Stat(s.file)
		text, err := os.ReadFile(s.file)
		if err != nil {
			return classed("config", err)
		}
		k, err := parseKubeconfig(string(text))
		if err != nil {
			return classed("config", err)
		}
		if s.server != "" {
			k.server, err = override(k.server, s.server)
			if err != nil {
				return classed("config", err)
			}
		}
		if s.client == nil || !bytes.Equal(k.ca, s.k.ca) || !bytes.Equal(k.cert, s.k.cert) ||
			!bytes.Equal(k.key, s.k.key) || k.server != s.k.server {
			if s.client != nil {
				fmt.Println("reload kubeconfig" + how)
			}
			changed = true
		}
		s.k = k
		if statErr == nil {
			s.stamp = info
		}
	}
	if readCA {
		ca, err := os.ReadFile(s.caFile)
		if err != nil {
			return classed("config", err)
		}
		if s.ca != nil && !bytes.Equal(ca, s.ca) {
			fmt.Println("reload ca" + how)
			changed = true
		}
		if s.ca == nil {
			changed = true
		}
		s.ca = ca
	}
	if !changed && s.client != nil {
		return nil
	}
	pair, err := tls.X509KeyPair(s.k.cert, s.k.key)
	if err != nil {
		return classed("config", fmt.Errorf("client certificate and key: %w", err))
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return classed("config", err)
	}
	s.leaf = leaf
	trust := s.k.ca
	if s.caFile != "" {
		trust = s.ca
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(trust) {
		return classed("config", errors.New("the CA holds no PEM certificate"))
	}
	s.client = &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			TLSClientConfig:   &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}},
		},
	}
	return nil
}

// override replaces the scheme, host and port of server with those of with, keeping server's path.
func override(server, with string) (string, error) {
	u, err := url.Parse(server)
	if err != nil {
		return "", err
	}
	w, err := url.Parse(with)
	if err != nil || w.Scheme != "https" || w.Host == "" {
		return "", fmt.Errorf("-server %s is not an https URL", with)
	}
	u.Scheme, u.Host = w.Scheme, w.Host
	return u.String(), nil
}

// probe makes one request with what was loaded.
func (s *state) probe(user string) error {
	leaf := s.leaf
	body := `{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`
	url := strings.TrimSuffix(s.k.server, "/") + "/apis/authentication.k8s.io/v1/selfsubjectreviews"
	resp, err := s.client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return ended(leaf, err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 {
		served := resp.TLS.PeerCertificates[0]
		line := fmt.Sprintf("server %s authorityKeyId %s", served.SerialNumber.Text(16), colonHex(served.AuthorityKeyId))
		if line != s.lastServer {
			s.lastServer = line
			fmt.Println(line)
		}
	}
	if resp.StatusCode != http.StatusCreated {
		class := "http"
		switch {
		case resp.StatusCode == 401, resp.StatusCode == 403:
			class = fmt.Sprint(resp.StatusCode)
		case resp.StatusCode >= 500:
			class = "5xx"
		}
		return classed(class, ended(leaf, fmt.Errorf("%s: %d %s", url, resp.StatusCode, bytes.TrimSpace(answer))))
	}
	var review struct {
		Status struct {
			UserInfo struct {
				Username string `json:"username"`
			} `json:"userInfo"`
		} `json:"status"`
	}
	if err := json.Unmarshal(answer, &review); err != nil {
		return classed("user", fmt.Errorf("the review: %w", err))
	}
	if review.Status.UserInfo.Username != user {
		return classed("user", fmt.Errorf("the server says %q, not %q", review.Status.UserInfo.Username, user))
	}
	return nil
}

// colonHex is b as lower-case hex bytes joined by colons (OpenSSL's form), or "none".
func colonHex(b []byte) string {
	if len(b) == 0 {
		return "none"
	}
	parts := make([]string, len(b))
	for i, c := range b {
		parts[i] = fmt.Sprintf("%02x", c)
	}
	return strings.Join(parts, ":")
}

type kubeconfig struct {
	server        string
	ca, cert, key []byte
}

// parseKubeconfig takes what the probe uses from a kubeconfig; every piece must be there.
func parseKubeconfig(text string) (kubeconfig, error) {
	root, err := parseYAML(text)
	if err != nil {
		return kubeconfig{}, err
	}
	doc, _ := root.(map[string]any)
	current, _ := doc["current-context"].(string)
	context := named(doc["contexts"], current, "context")
	clusterName, _ := context["cluster"].(string)
	userName, _ := context["user"].(string)
	cluster := named(doc["clusters"], clusterName, "cluster")
	user := named(doc["users"], userName, "user")
	var k kubeconfig
	k.server, _ = cluster["server"].(string)
	if k.server == "" {
		return k, fmt.Errorf("no server for context %q", current)
	}
	for _, field := range []struct {
		m    map[string]any
		key  string
		into *[]byte
	}{
		{cluster, "certificate-authority-data", &k.ca},
		{user, "client-certificate-data", &k.cert},
		{user, "client-key-data", &k.key},
	} {
		s, _ := field.m[field.key].(string)
		data, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(data) == 0 {
			return k, fmt.Errorf("context %q: no %s", current, field.key)
		}
		if block, _ := pem.Decode(data); block == nil {
			return k, fmt.Errorf("context %q: %s is not PEM", current, field.key)
		}
		*field.into = data
	}
	return k, nil
}

// named finds, in a list of {name: ..., <inner>: {...}}, the inner map of the entry called name.
func named(list any, name, inner string) map[string]any {
	items, _ := list.([]any)
	for _, item := range items {
		m, _ := item.(map[string]any)
		if n, _ := m["name"].(string); n == name {
			v, _ := m[inner].(map[string]any)
			return v
		}
	}
	return nil
}

type line struct {
	indent int
	text   string
}

// parseYAML reads block YAML of mappings, sequences and plain or quoted scalars (what kubeconfig writers
// emit); flow collections ({} and []) read as empty.
func parseYAML(text string) (any, error) {
	var lines []line
	for _, raw := range strings.Split(text, "\n") {
		trimmed := strings.TrimLeft(raw, " ")
		if trimmed == "" || strings.HasPrefix(trimmed, "#") || trimmed == "---" {
			continue
		}
		lines = append(lines, line{len(raw) - len(trimmed), strings.TrimRight(trimmed, " \r")})
	}
	p := &parser{lines: lines}
	if len(lines) == 0 {
		return nil, errors.New("empty kubeconfig")
	}
	v, err := p.block(lines[0].indent)
	if err == nil && p.i < len(p.lines) {
		err = fmt.Errorf("unexpected line %q", p.lines[p.i].text)
	}
	return v, err
}

type parser struct {
	lines []line
	i     int
}

func (p *parser) block(indent int) (any, error) {
	if strings.HasPrefix(p.lines[p.i].text, "- ") || p.lines[p.i].text == "-" {
		return p.sequence(indent)
	}
	return p.mapping(indent)
}

func (p *parser) sequence(indent int) (any, error) {
	var out []any
	for p.i < len(p.lines) && p.lines[p.i].indent == indent && strings.HasPrefix(p.lines[p.i].text+" ", "- ") {
		rest := strings.TrimPrefix(strings.TrimPrefix(p.lines[p.i].text, "-"), " ")
		if rest == "" {
			p.i++
			if p.i >= len(p.lines) || p.lines[p.i].indent <= indent {
				out = append(out, nil)
				continue
			}
			v, err := p.block(p.lines[p.i].indent)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
			continue
		}
		// "- key: value" starts a mapping whose keys sit where "key" does.
		p.lines[p.i] = line{indent + 2, rest}
		v, err := p.block(indent + 2)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func (p *parser) mapping(indent int) (any, error) {
	out := map[string]any{}
	for p.i < len(p.lines) && p.lines[p.i].indent == indent && !strings.HasPrefix(p.lines[p.i].text, "- ") {
		text := p.lines[p.i].text
		colon := strings.Index(text, ": ")
		if colon < 0 && strings.HasSuffix(text, ":") {
			colon = len(text) - 1
		}
		if colon < 0 {
			return nil, fmt.Errorf("not a mapping entry: %q", text)
		}
		key := unquote(text[:colon])
		value := strings.TrimSpace(text[colon+1:])
		p.i++
		if value != "" {
			out[key] = scalar(value)
			continue
		}
		// A nested block: more indented, or a sequence at the key's own indent.
		if p.i < len(p.lines) &&
			(p.lines[p.i].indent > indent || (p.lines[p.i].indent == indent && strings.HasPrefix(p.lines[p.i].text+" ", "- "))) {
			v, err := p.block(p.lines[p.i].indent)
			if err != nil {
				return nil, err
			}
			out[key] = v
		} else {
			out[key] = nil
		}
	}
	return out, nil
}

func scalar(value string) any {
	switch value {
	case "{}":
		return map[string]any{}
	case "[]":
		return []any{}
	}
	return unquote(value)
}

func unquote(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		var out string
		if json.Unmarshal([]byte(s), &out) == nil {
			return out
		}
	}
	if len(s) >= 2 && s[0] == '\'' && s[len(s)-1] == '\'' {
		return strings.ReplaceAll(s[1:len(s)-1], "''", "'")
	}
	return s
}

// ended marks err when the client certificate was past its notAfter as the request finished.
func ended(leaf *x509.Certificate, err error) error {
	if time.Now().After(leaf.NotAfter) {
		return classed(classOf(err), fmt.Errorf("%w (the client certificate ended at %s)", err, leaf.NotAfter.UTC().Format(time.RFC3339)))
	}
	return err
}

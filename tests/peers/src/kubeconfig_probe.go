// kubeconfig-probe uses a kubeconfig file the way a hub that reloads its mounted kubeconfig would: every
// -every it reads the file again (the kubelet swaps a mounted Secret's files atomically), and POSTs a
// SelfSubjectReview to its current context's server over a new TLS connection (no keep-alive: a connection made
// with an old certificate would hide that certificate's expiry), with the client certificate and key and the CA
// the file holds now. It counts requests and failures; a request fails unless it is answered 201 naming the
// expected user.
//
// It prints one line per failure ("fail <n> <why>", with "(the client certificate ended at <RFC 3339>)" when it
// was used past its notAfter: a renewal that reached the file too late, not a refused valid one), one line whenever the client certificate changes ("cert
// <serial> notAfter <RFC 3339>"), and a summary line every second ("requests <n> failures <n> certs <n>"), so
// the last summary line of its log says how it went.
//
// The kubeconfig is parsed for exactly what it needs (current-context, its context's cluster and user, their
// server, certificate-authority-data, client-certificate-data and client-key-data) by a reader of the block
// YAML kubeconfig writers emit; anything else in the file is ignored.
//
// Usage: kubeconfig-probe -kubeconfig FILE -user NAME [-every 200ms]
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	file := flag.String("kubeconfig", "", "the kubeconfig file (required)")
	user := flag.String("user", "", "the username the SelfSubjectReview must report (required)")
	every := flag.Duration("every", 200*time.Millisecond, "how often to make a request")
	flag.Parse()
	if *file == "" || *user == "" {
		fmt.Fprintln(os.Stderr, "usage: kubeconfig-probe -kubeconfig FILE -user NAME [-every 200ms]")
		os.Exit(2)
	}
	var requests, failures, certs int
	lastCert := ""
	lastSummary := time.Now()
	for tick := time.NewTicker(*every); ; <-tick.C {
		requests++
		cert, err := probe(*file, *user)
		if cert != "" && cert != lastCert {
			certs++
			lastCert = cert
			fmt.Println(cert)
		}
		if err != nil {
			failures++
			fmt.Printf("fail %d %v\n", requests, err)
		}
		if time.Since(lastSummary) >= time.Second {
			lastSummary = time.Now()
			fmt.Printf("requests %d failures %d certs %d\n", requests, failures, certs)
		}
	}
}

// probe makes one request with the file as it is now; it returns the client certificate's "cert" line when it
// could read one.
func probe(file, user string) (string, error) {
	text, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	k, err := parseKubeconfig(string(text))
	if err != nil {
		return "", err
	}
	pair, err := tls.X509KeyPair(k.cert, k.key)
	if err != nil {
		return "", fmt.Errorf("client certificate and key: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return "", err
	}
	certLine := fmt.Sprintf("cert %s notAfter %s", leaf.SerialNumber.Text(16), leaf.NotAfter.UTC().Format(time.RFC3339))
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(k.ca) {
		return certLine, errors.New("certificate-authority-data holds no PEM certificate")
	}
	client := &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			TLSClientConfig:   &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}},
		},
	}
	body := `{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`
	url := strings.TrimSuffix(k.server, "/") + "/apis/authentication.k8s.io/v1/selfsubjectreviews"
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return certLine, ended(leaf, err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusCreated {
		return certLine, ended(leaf, fmt.Errorf("%s: %d %s", url, resp.StatusCode, bytes.TrimSpace(answer)))
	}
	var review struct {
		Status struct {
			UserInfo struct {
				Username string `json:"username"`
			} `json:"userInfo"`
		} `json:"status"`
	}
	if err := json.Unmarshal(answer, &review); err != nil {
		return certLine, fmt.Errorf("the review: %w", err)
	}
	if review.Status.UserInfo.Username != user {
		return certLine, fmt.Errorf("the server says %q, not %q", review.Status.UserInfo.Username, user)
	}
	return certLine, nil
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
		return fmt.Errorf("%w (the client certificate ended at %s)", err, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return err
}

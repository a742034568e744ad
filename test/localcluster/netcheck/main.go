// Command netcheck is the local cluster's network probe: the real node's test
// (test/localcluster/cluster) packs it into an image and runs it in pods to
// check what kube-proxy and cluster DNS give a pod, with nothing but the
// standard library, as a static binary in an image with no other file.
//
//	netcheck api            GET /version of the API server through the
//	                        kubernetes Service, with the pod's token and CA
//	netcheck serve PORT     answer every HTTP request with "netcheck <hostname>"
//	netcheck get URL        GET URL and print the body
//	netcheck lookup NAME    resolve NAME and print its addresses
//
// A check retries for up to a minute (the Service's rules, or its DNS
// record, may lag the pod's start), prints what it got and exits 0, or
// prints the last error and exits 1.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

// serviceAccountDir is where the kubelet mounts a pod's token and CA.
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

func main() {
	if len(os.Args) < 2 {
		fail(errors.New("usage: netcheck api | serve PORT | get URL | lookup NAME"))
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; {
	case cmd == "api" && len(args) == 0:
		err = retry(checkAPI)
	case cmd == "serve" && len(args) == 1:
		err = serve(args[0])
	case cmd == "get" && len(args) == 1:
		err = retry(func(ctx context.Context) (string, error) { return get(ctx, http.DefaultClient, args[0], "") })
	case cmd == "lookup" && len(args) == 1:
		err = retry(func(ctx context.Context) (string, error) {
			addrs, err := net.DefaultResolver.LookupHost(ctx, args[0])
			return strings.Join(addrs, " "), err
		})
	default:
		err = fmt.Errorf("unknown command %q", strings.Join(os.Args[1:], " "))
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	_, _ = fmt.Fprintln(os.Stderr, "netcheck:", err)
	os.Exit(1)
}

// retry runs check every second for up to a minute, until it succeeds, and
// prints its result.
func retry(check func(context.Context) (string, error)) error {
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		out, err := check(ctx)
		cancel()
		if err == nil {
			_, _ = fmt.Println(out)
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		_, _ = fmt.Fprintln(os.Stderr, "netcheck: retrying:", err)
		time.Sleep(time.Second)
	}
}

// checkAPI asks the API server for its version the way an in-cluster client
// does: the kubernetes Service's address from the environment, the
// ServiceAccount's CA and token.
func checkAPI(ctx context.Context) (string, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return "", errors.New("KUBERNETES_SERVICE_HOST or KUBERNETES_SERVICE_PORT is not set")
	}
	ca, err := os.ReadFile(serviceAccountDir + "/ca.crt")
	if err != nil {
		return "", err
	}
	token, err := os.ReadFile(serviceAccountDir + "/token")
	if err != nil {
		return "", err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return "", errors.New("no certificate in ca.crt")
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	return get(ctx, client, "https://"+net.JoinHostPort(host, port)+"/version", strings.TrimSpace(string(token)))
}

func get(ctx context.Context, client *http.Client, url, token string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return string(body), nil
}

func serve(port string) error {
	hostname, _ := os.Hostname()
	srv := &http.Server{
		Addr:              ":" + port,
		ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// Each request is logged, for kubectl logs and attach.
			_, _ = fmt.Printf("served %s %s\n", r.Method, r.URL.Path)
			_, _ = fmt.Fprintf(w, "netcheck %s\n", hostname)
		}),
	}
	return srv.ListenAndServe()
}

// Command probe runs inside the operator's image under test (test/image): it
// reports, as one JSON object on stdout, what a process of the image sees: its
// user and groups, whether it can write to the root file system, and what the
// runtime base provides (CA certificates, tzdata, the passwd entry of its user,
// no shell). The test bind-mounts it into the container; it is not part of the
// image.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-dev/outbox-operator/test/image"
)

func main() {
	groups, _ := os.Getgroups()
	r := image.ProbeReport{
		UID: os.Getuid(), GID: os.Getgid(), EUID: os.Geteuid(), EGID: os.Getegid(), Groups: groups,
		WriteErrors: map[string]string{},
		Env:         os.Environ(),
	}
	if u, err := user.LookupId(strconv.Itoa(r.UID)); err != nil {
		r.UserName = "lookup: " + err.Error()
	} else {
		r.UserName, r.HomeDir = u.Username, u.HomeDir
	}
	for _, dir := range []string{"/", "/tmp", "/etc", "/home/nonroot"} {
		path := filepath.Join(dir, "probe-write-test")
		if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
			r.WriteErrors[path] = err.Error()
		} else {
			r.WriteErrors[path] = ""
			_ = os.Remove(path)
		}
	}
	certFile := os.Getenv("SSL_CERT_FILE")
	if certFile == "" {
		certFile = "/etc/ssl/certs/ca-certificates.crt"
	}
	if pem, err := os.ReadFile(certFile); err == nil {
		r.CACertificates = strings.Count(string(pem), "-----BEGIN CERTIFICATE-----")
	}
	if _, err := time.LoadLocation("Europe/Berlin"); err != nil {
		r.TimeZone = err.Error()
	}
	for _, sh := range []string{"/bin/sh", "/bin/bash", "/bin/busybox"} {
		if _, err := os.Lstat(sh); err == nil {
			r.Shell = sh
			break
		}
	}
	if entries, err := os.ReadDir("/"); err == nil {
		for _, e := range entries {
			r.RootEntries = append(r.RootEntries, e.Name())
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(1)
	}
}

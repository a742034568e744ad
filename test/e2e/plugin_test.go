//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// The kubectl plugin (cmd/kubectl-outbox, docs/kubectl-plugin.md), installed
// by copying it onto the PATH and run as `kubectl outbox`.

// pluginResult is one run of `kubectl outbox`.
type pluginResult struct {
	stdout, stderr string
	code           int
}

var pluginDir string

// outbox runs `kubectl outbox args...` with the plugin's dir first on PATH.
func outbox(args ...string) pluginResult {
	GinkgoHelper()
	cctx, ccancel := context.WithTimeout(ctx, 3*time.Minute)
	defer ccancel()
	cmd := exec.CommandContext(cctx, "kubectl", append([]string{"outbox", "-n", namespace}, args...)...)
	cmd.Env = append(kubeEnv(), "PATH="+pluginDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := pluginResult{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		r.code = exit.ExitCode()
	} else {
		Expect(err).NotTo(HaveOccurred())
	}
	_, _ = fmt.Fprintf(GinkgoWriter, "$ kubectl outbox %s\n%s%s(exit %d)\n", strings.Join(args, " "), r.stdout, r.stderr, r.code)
	return r
}

// commandPods are the plugin's pods of the namespace that are not being
// deleted.
func commandPods() []string {
	out, err := kubectlErr("-n", namespace, "get", "pods", "-l", "app.kubernetes.io/component=command",
		"-o", `go-template={{range .items}}{{if not .metadata.deletionTimestamp}}{{.metadata.name}} {{end}}{{end}}`)
	Expect(err).NotTo(HaveOccurred())
	return strings.Fields(out)
}

// lastJSON decodes the last line of out that is a JSON object with the key.
func lastJSON(out, key string, v any) {
	GinkgoHelper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		var m map[string]json.RawMessage
		if json.Unmarshal([]byte(lines[i]), &m) == nil && m[key] != nil {
			Expect(json.Unmarshal([]byte(lines[i]), v)).To(Succeed())
			return
		}
	}
	Fail(fmt.Sprintf("no JSON line with %q in %q", key, out))
}

// pluginScenarios are the plugin's scenarios of the suite's ordered
// container: the commands against the sample's relay, and the dead letters
// and the replay against an OutboxRelay, table and stream of their own.
func pluginScenarios() {
	Context("kubectl outbox", Ordered, func() {
		const (
			name   = "e2e-plugin"
			table  = "e2e_plugin"
			pstrm  = "e2e-plugin"
			nosecr = "e2e-plugin-nosecret"
		)

		BeforeAll(func() {
			By("building the plugin and putting it on the PATH")
			pluginDir = GinkgoT().TempDir()
			build := exec.Command("go", "build", "-o", filepath.Join(pluginDir, "kubectl-outbox"), "./cmd/kubectl-outbox")
			build.Dir = env.root
			out, err := build.CombinedOutput()
			Expect(err).NotTo(HaveOccurred(), string(out))

			By("an OutboxRelay of the scenario on a table whose payload may be NULL")
			_, err = db.Exec(ctx, `DROP TABLE IF EXISTS `+table+`, `+table+`_dead_letters`)
			Expect(err).NotTo(HaveOccurred())
			_, err = db.Exec(ctx, `CREATE TABLE `+table+` (
				id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
				event_type text NOT NULL,
				payload text NULL,
				created_at timestamptz NOT NULL DEFAULT now(),
				dispatched_at timestamptz)`)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(func() { _, _ = db.Exec(ctx, `DROP TABLE IF EXISTS `+table+`_dead_letters`) })
			orderedRelay(name, table, pstrm, "", "  replicas: {min: 1, max: 1}")
			waitRelayReady(name, 3*time.Minute)
		})

		AfterAll(func() {
			Expect(commandPods()).To(BeEmpty(), "every plugin pod deleted")
		})

		It("shows the sample relay's status, runs doctor, backlog and cleanup in the cluster, and pauses and resumes it", func() {
			By("kubectl outbox status: one line per OutboxRelay")
			r := outbox("status")
			Expect(r.code).To(Equal(0))
			Expect(r.stdout).To(ContainSubstring("NAME"))
			Expect(r.stdout).To(MatchRegexp(`(?m)^orders\s+jobs\s+\d+`))

			By("kubectl outbox status orders: conditions, Redis checks and the stream's consumer groups")
			r = outbox("status", relayName)
			Expect(r.code).To(Equal(0))
			for _, want := range []string{"OutboxRelay:      default/orders", "Conditions:", "RelaysAvailable", "Redis checks:", "Stream jobs: "} {
				Expect(r.stdout).To(ContainSubstring(want))
			}
			Expect(r.stdout).NotTo(ContainSubstring("not read"))
			r = outbox("status", relayName, "-o", "json")
			Expect(r.code).To(Equal(0))
			var st struct {
				Name       string `json:"name"`
				Backlog    *int64 `json:"backlog"`
				Conditions []struct {
					Type, Reason string
				} `json:"conditions"`
				StreamInfo *struct {
					Exists bool  `json:"exists"`
					Length int64 `json:"length"`
					Groups []struct {
						Name    string `json:"name"`
						Pending int64  `json:"pending"`
						Lag     int64  `json:"lag"`
					} `json:"groups"`
				} `json:"streamInfo"`
			}
			Expect(json.Unmarshal([]byte(r.stdout), &st)).To(Succeed())
			Expect(st.Name).To(Equal(relayName))
			Expect(st.Backlog).NotTo(BeNil())
			Expect(st.Conditions).NotTo(BeEmpty())
			Expect(st.StreamInfo).NotTo(BeNil())
			Expect(st.StreamInfo.Exists).To(BeTrue())
			Expect(st.StreamInfo.Length).To(Equal(streamLen(stream)))
			Expect(st.StreamInfo.Groups).NotTo(BeEmpty(), "the worker's consumer group")
			Expect(outbox("status", relayName, "-o", "yaml").stdout).To(ContainSubstring("streamInfo:"))
			Expect(commandPods()).To(BeEmpty())

			By("kubectl outbox doctor orders: its exit status is relay doctor's")
			r = outbox("doctor", relayName)
			Expect(r.stdout).To(ContainSubstring("postgres.connection"))
			Expect(r.stdout).To(ContainSubstring("redis.connection"))
			Expect(r.stdout).To(MatchRegexp(`(?m)^ok\s+outbox\.table`))
			if strings.Contains(r.stdout, "\nfail ") || strings.HasPrefix(r.stdout, "fail ") {
				Expect(r.code).To(Equal(1), "a failed check exits 1")
			} else {
				Expect(r.code).To(Equal(0))
			}

			By("kubectl outbox backlog orders -o json")
			r = outbox("backlog", relayName, "-o", "json")
			Expect(r.code).To(Equal(0))
			var b struct {
				Count       *int64 `json:"count"`
				DeadLetters *int64 `json:"deadLetters"`
			}
			lastJSON(r.stdout, "count", &b)
			Expect(b.Count).NotTo(BeNil())

			By("kubectl outbox cleanup orders")
			r = outbox("cleanup", relayName)
			Expect(r.code).To(Equal(0))
			Expect(r.stdout).To(ContainSubstring("dispatched rows older than 72h0m0s"))
			Expect(commandPods()).To(BeEmpty())

			By("kubectl outbox pause orders: spec.suspend, the relays at 0")
			r = outbox("pause", relayName)
			DeferCleanup(func() { patchRelay(`{"spec":{"suspend":false}}`) })
			Expect(r.code).To(Equal(0))
			Expect(r.stdout).To(ContainSubstring("spec.suspend false -> true"))
			Expect(jsonpath("outboxrelay", relayName, "{.spec.suspend}")).To(Equal("true"))
			Eventually(func() (int, error) { return jsonpathInt("deploy", relayName+"-relay", "{.spec.replicas}") }).
				WithTimeout(time.Minute).Should(Equal(0))
			Expect(outbox("pause", relayName).stdout).To(ContainSubstring("nothing changed"))

			By("kubectl outbox resume orders")
			r = outbox("resume", relayName)
			Expect(r.code).To(Equal(0))
			Expect(r.stdout).To(ContainSubstring("spec.suspend true -> false"))
			waitRelayReady(relayName, 3*time.Minute)
		})

		It("lists a dead letter and retries it, and replays after the stream was deleted", func() {
			By("a row whose payload is NULL is parked")
			var parked string
			Expect(db.QueryRow(ctx, `INSERT INTO `+table+` (event_type, payload) VALUES ('e2e_null', NULL) RETURNING id::text`).
				Scan(&parked)).To(Succeed())
			type deadLetter struct {
				ID      int64  `json:"id"`
				EventID string `json:"eventId"`
				Reason  string `json:"reason"`
			}
			var list []deadLetter
			Eventually(func() []deadLetter {
				r := outbox("dead-letters", "list", name, "-o", "json")
				list = nil
				if r.code == 0 {
					lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
					for i := len(lines) - 1; i >= 0; i-- {
						if strings.HasPrefix(lines[i], "[") && json.Unmarshal([]byte(lines[i]), &list) == nil {
							break
						}
					}
				}
				return list
			}).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(HaveLen(1))
			Expect(list[0].EventID).To(Equal(parked))
			Expect(outbox("dead-letters", "list", name).stdout).To(ContainSubstring("e2e_null"))

			By("retry while the payload is still NULL: refused, exit status 1")
			r := outbox("dead-letters", "retry", name, "--id", fmt.Sprint(list[0].ID))
			Expect(r.code).To(Equal(1))

			By("the payload fixed in the dead-letter table, retry publishes it")
			_, err := db.Exec(ctx, `UPDATE `+table+`_dead_letters SET payload = '{"fixed":true}' WHERE id = $1`, list[0].ID)
			Expect(err).NotTo(HaveOccurred())
			r = outbox("dead-letters", "retry", name, "--id", fmt.Sprint(list[0].ID), "-o", "json")
			Expect(r.code).To(Equal(0))
			Expect(streamCounts(pstrm, map[string]bool{parked: true})[parked]).To(Equal(1))
			Expect(outbox("dead-letters", "list", name, "-o", "json").stdout).To(ContainSubstring("[]"))

			By("rows relayed, the stream deleted, kubectl outbox replay --since")
			since := time.Now().Add(-time.Second).UTC().Format(time.RFC3339)
			var ids []string
			for i := 0; i < 3; i++ {
				var id string
				Expect(db.QueryRow(ctx, `INSERT INTO `+table+` (event_type, payload) VALUES ('e2e_replay', $1) RETURNING id::text`,
					fmt.Sprintf(`{"n":%d}`, i)).Scan(&id)).To(Succeed())
				ids = append(ids, id)
			}
			Eventually(func() (int, error) { return undispatched(table, ids) }).WithTimeout(time.Minute).Should(Equal(0))
			Expect(rdb.Del(ctx, pstrm).Err()).To(Succeed())
			Expect(streamLen(pstrm)).To(BeZero())
			r = outbox("replay", name, "--since", since, "-o", "json")
			Expect(r.code).To(Equal(0))
			counts := streamCounts(pstrm, set(ids))
			for _, id := range ids {
				Expect(counts[id]).To(BeNumerically(">=", 1), "event %s replayed", id)
			}
			Expect(commandPods()).To(BeEmpty())
		})

		It("says clearly when the name is wrong or the relay's Secret is missing, and leaves no pod behind", func() {
			By("a wrong name")
			for _, args := range [][]string{{"status", "nope"}, {"doctor", "nope"}, {"dead-letters", "list", "nope"}, {"pause", "nope"}} {
				r := outbox(args...)
				Expect(r.code).To(Equal(1))
				Expect(r.stderr).To(ContainSubstring(`outboxrelay "nope" not found in namespace "default"`))
			}

			By("a relay whose Secret does not exist")
			_, err := kubectlIn(fmt.Sprintf(`apiVersion: relay.outbox.dev/v1alpha1
kind: OutboxRelay
metadata: {name: %s}
spec:
  postgres: {dsnSecretRef: {name: e2e-missing, key: dsn}, table: %s}
  redis: {urlSecretRef: {name: e2e-missing, key: url}, stream: %s}
  cleanup: {suspend: true}
`, nosecr, table, pstrm), "-n", namespace, "apply", "-f", "-")
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(func() { _, _ = kubectlErr("-n", namespace, "delete", "outboxrelay", nosecr, "--ignore-not-found") })
			image := kubectl("-n", namespace, "get", "deploy", relayName+"-relay", "-o", "jsonpath={.spec.template.spec.containers[0].image}")
			r := outbox("backlog", nosecr, "--image", image)
			Expect(r.code).To(Equal(1))
			Expect(r.stderr).To(ContainSubstring("could not start"))
			Expect(r.stderr).To(ContainSubstring(`secret "e2e-missing" not found`))
			Expect(commandPods()).To(BeEmpty())
			r = outbox("status", nosecr, "--image", image)
			Expect(r.code).To(Equal(0), "the status shows even when the stream cannot be read")
			Expect(r.stdout).To(ContainSubstring("Stream e2e-plugin: not read: "))

			By("a user who may only read OutboxRelays: each command says which permission it lacks")
			_, err = kubectlIn(`apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: e2e-plugin-reader}
rules:
- apiGroups: [relay.outbox.dev]
  resources: [outboxrelays]
  verbs: [get, list]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: e2e-plugin-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: e2e-plugin-reader}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: e2e-plugin-reader}
`, "-n", namespace, "apply", "-f", "-")
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(func() {
				_, _ = kubectlErr("-n", namespace, "delete", "role,rolebinding", "e2e-plugin-reader", "--ignore-not-found")
			})
			r = outbox("--as", "e2e-plugin-reader", "doctor", relayName)
			Expect(r.code).To(Equal(1))
			Expect(r.stderr).To(ContainSubstring(fmt.Sprintf(`not allowed to create pods in namespace %q`, namespace)))
			r = outbox("--as", "e2e-plugin-reader", "pause", relayName)
			Expect(r.code).To(Equal(1))
			Expect(r.stderr).To(ContainSubstring(fmt.Sprintf(`not allowed to patch outboxrelay %q`, relayName)))
			r = outbox("--as", "e2e-plugin-reader", "status", relayName)
			Expect(r.code).To(Equal(0), "the status shows without the right to run a pod")
			Expect(r.stdout).To(ContainSubstring("not read: not allowed to create pods"))

			By("a user with no rights in the namespace")
			r = outbox("--as", "e2e-plugin-nobody", "status", relayName)
			Expect(r.code).To(Equal(1))
			Expect(r.stderr).To(ContainSubstring(fmt.Sprintf(`not allowed to read outboxrelay %q in namespace %q`, relayName, namespace)))
			Expect(kubectl("-n", namespace, "get", "outboxrelay", relayName, "-o", "jsonpath={.spec.suspend}")).NotTo(Equal("true"))
			Expect(commandPods()).To(BeEmpty())

			By("Ctrl-C while the relay runs: the pod is deleted")
			cmd := exec.Command("kubectl", "outbox", "-n", namespace, "doctor", relayName)
			cmd.Env = append(kubeEnv(), "PATH="+pluginDir+string(os.PathListSeparator)+os.Getenv("PATH"))
			stderr, err := cmd.StderrPipe()
			Expect(err).NotTo(HaveOccurred())
			Expect(cmd.Start()).To(Succeed())
			buf := make([]byte, 4096)
			n, _ := stderr.Read(buf) // "Running relay doctor in pod ..."
			Expect(string(buf[:n])).To(ContainSubstring("Running relay doctor in pod"))
			Expect(cmd.Process.Signal(syscall.SIGINT)).To(Succeed())
			go func() { _, _ = stderr.Read(buf) }()
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			Eventually(done).WithTimeout(time.Minute).Should(Receive())
			Eventually(commandPods).WithTimeout(30 * time.Second).Should(BeEmpty())
		})
	})
}

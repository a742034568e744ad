//go:build faults

package faults

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// relayBin is the relay binary of this checkout, built once per run.
var relayBin string

// TestMain builds cmd/relay into a temp dir (FAULTS_RELAY_BIN names a
// prebuilt one instead), runs the cases and removes the
// dir. The cases start dedicated servers (testenv.StartPostgres and
// StartRedis), which their own cleanups stop by pid.
func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	sweepStaleDirs()
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", dirPrefix, os.Getpid()))
	if err != nil {
		fmt.Fprintf(os.Stderr, "faults: %v\n", err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	relayBin = filepath.Join(dir, "relay")
	if prebuilt := os.Getenv("FAULTS_RELAY_BIN"); prebuilt != "" {
		// Another build of the relay, e.g. an older commit's, to see which
		// cases it fails.
		relayBin = prebuilt
	} else if err := buildRelay(relayBin); err != nil {
		fmt.Fprintf(os.Stderr, "faults: %v\n", err)
		return 1
	}
	return m.Run()
}

// buildRelay runs go build ./cmd/relay from the repository root.
func buildRelay(out string) error {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return fmt.Errorf("cannot locate the repository root")
	}
	cmd := exec.Command("go", "build", "-o", out, "./cmd/relay")
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/relay: %w\n%s", err, msg)
	}
	return nil
}

// dirPrefix names the build dirs: outbox-faults-<pid of the test binary>-<random>.
const dirPrefix = "outbox-faults-"

// sweepStaleDirs removes the build dirs of test binaries that were killed
// before they could remove their own.
func sweepStaleDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		pidText, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(dir), dirPrefix), "-")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			_ = os.RemoveAll(dir)
		}
	}
}

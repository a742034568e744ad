package packaging

import (
	"bufio"
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// goTool is the go command that runs these tests.
func goTool(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("go")
	require.NoError(t, err, "the go command is not on PATH")
	return path
}

// commands are the directories of cmd/: one binary each in the image.
func commands(t testing.TB) []string { return testenv.Commands(t, repoRoot) }

// The image's binaries build for both platforms it ships for, static
// (CGO_ENABLED=0), as the Dockerfile builds them.
func TestBinariesBuildForLinux(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("cross-compiling every binary twice takes minutes; not with -short")
	}
	want := commands(t)
	goCmd := goTool(t)
	for arch, machine := range map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64} {
		t.Run(arch, func(t *testing.T) {
			t.Parallel()
			out := t.TempDir()
			ctx, cancel := buildContext(t)
			defer cancel()
			cmd := exec.CommandContext(ctx, goCmd, "build", "-trimpath", "-ldflags=-s -w -X main.version=test",
				"-o", out+string(filepath.Separator), "./cmd/...")
			cmd.Dir = repoRoot
			// GOFLAGS off: a -race from the caller would need cgo.
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOFLAGS=")
			output, err := cmd.CombinedOutput()
			require.NoError(t, err, "GOARCH=%s go build ./cmd/...:\n%s", arch, output)

			entries, err := os.ReadDir(out)
			require.NoError(t, err)
			got := make([]string, 0, len(entries))
			for _, e := range entries {
				got = append(got, e.Name())
			}
			require.ElementsMatch(t, want, got, "one binary per directory of cmd/")
			for _, name := range got {
				f, err := elf.Open(filepath.Join(out, name))
				require.NoError(t, err, name)
				require.Equal(t, machine, f.Machine, "%s is not a linux/%s binary", name, arch)
				for _, p := range f.Progs {
					require.NotEqual(t, elf.PT_INTERP, p.Type, "%s is dynamically linked", name)
				}
				require.NoError(t, f.Close())
			}
		})
	}
}

// buildContext bounds a cross-compile: 15 minutes, and a minute short of the
// test binary's -timeout, so that a slow build fails this test (and TestMain
// still stops the API server) rather than panicking the whole binary.
func buildContext(t *testing.T) (context.Context, context.CancelFunc) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Minute)
	if d, ok := t.Deadline(); ok && d.Add(-time.Minute).Before(deadline) {
		deadline = d.Add(-time.Minute)
	}
	return context.WithDeadline(context.Background(), deadline)
}

// dockerfileCopies returns the directories the Dockerfile's build stage
// copies from the context (COPY <dir>/ <dir>/).
func dockerfileCopies(t testing.TB) (copies []string, lines []string) {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, "Dockerfile"))
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		lines = append(lines, line)
		fields := strings.Fields(line)
		if len(fields) == 3 && fields[0] == "COPY" && strings.HasSuffix(fields[1], "/") {
			copies = append(copies, strings.TrimSuffix(fields[1], "/"))
		}
	}
	require.NoError(t, sc.Err())
	return copies, lines
}

// The image build copies every directory the binaries are built from, and
// .dockerignore lets each into the context: a new top-level package breaks
// here, not in a Docker build that this machine cannot run.
func TestDockerfileCopiesEverySourceDir(t *testing.T) {
	t.Parallel()
	copies, lines := dockerfileCopies(t)
	out, err := run(context.Background(), nil, goTool(t), "list", "-deps",
		"-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}|{{join .EmbedFiles \",\"}}{{end}}{{end}}", "./cmd/...")
	require.NoError(t, err)
	ignore, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	require.NoError(t, err)

	var dirs []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		dir, embeds, _ := strings.Cut(line, "|")
		rel, err := filepath.Rel(repoRoot, dir)
		require.NoError(t, err)
		dirs = append(dirs, strings.SplitN(filepath.ToSlash(rel), "/", 2)[0])
		for _, e := range strings.Split(embeds, ",") {
			require.False(t, strings.HasPrefix(e, "testdata/") || strings.HasSuffix(e, "_test.go"),
				"%s embeds %s, which .dockerignore leaves out", rel, e)
		}
	}
	slices.Sort(dirs)
	dirs = slices.Compact(dirs)
	for _, d := range dirs {
		require.Contains(t, copies, d, "the Dockerfile does not COPY %s/, which the binaries are built from", d)
		require.Contains(t, strings.Split(string(ignore), "\n"), "!"+d+"/**",
			".dockerignore keeps %s/ out of the build context", d)
	}

	// The base images are build arguments (make image-offline substitutes
	// local ones); their defaults are the golang and distroless images.
	require.Contains(t, lines, "ARG BUILDER_IMAGE=golang:${GO_VERSION}")
	require.Contains(t, lines, "FROM --platform=$BUILDPLATFORM ${BUILDER_IMAGE} AS builder")
	require.Contains(t, lines, "ARG RUNTIME_IMAGE=gcr.io/distroless/static:nonroot")
	build := strings.Join(lines, " ")
	require.Contains(t, build, "CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH}")

	// Two images from the one build, each a non-root distroless image with
	// its binaries at / (/relay is what the controller runs): the operator's
	// is the last stage, so a plain build makes it.
	stages := dockerfileStages(lines)
	require.Equal(t, []string{"builder", "sample", "operator"}, stageNames(stages))
	for _, want := range []struct {
		stage, entrypoint string
		binaries          []string
	}{
		{stage: "operator", entrypoint: "/manager", binaries: []string{"manager", "relay"}},
		{stage: "sample", entrypoint: "/orders-api", binaries: []string{"orders-api", "worker"}},
	} {
		st := stages[slices.IndexFunc(stages, func(s stage) bool { return s.name == want.stage })]
		require.Equal(t, "FROM ${RUNTIME_IMAGE} AS "+want.stage, st.lines[0])
		require.Contains(t, st.lines, "USER 65532:65532", want.stage)
		require.Contains(t, st.lines, `ENTRYPOINT ["`+want.entrypoint+`"]`, want.stage)
		var from []string
		for _, b := range want.binaries {
			from = append(from, "/out/"+b)
			require.Contains(t, build, "./cmd/"+b, "the build stage does not build cmd/%s", b)
		}
		require.Contains(t, st.lines, "COPY --from=builder "+strings.Join(from, " ")+" /", want.stage)
	}
	// Every command but the kubectl plugin (a client, installed with krew)
	// is in one of the two images.
	for _, c := range commands(t) {
		if c != "kubectl-outbox" {
			require.Contains(t, build, "./cmd/"+c+" ", "cmd/%s is in neither image", c)
		}
	}
}

// stage is one FROM of the Dockerfile and the lines up to the next.
type stage struct {
	name  string
	lines []string
}

func dockerfileStages(lines []string) []stage {
	var stages []stage
	for _, l := range lines {
		if strings.HasPrefix(l, "FROM ") {
			f := strings.Fields(l)
			stages = append(stages, stage{name: f[len(f)-1]})
		}
		if len(stages) > 0 && l != "" && !strings.HasPrefix(l, "#") {
			stages[len(stages)-1].lines = append(stages[len(stages)-1].lines, l)
		}
	}
	return stages
}

func stageNames(stages []stage) []string {
	names := make([]string, len(stages))
	for i, s := range stages {
		names[i] = s.name
	}
	return names
}

// The image builds with the Go of go.mod: the golang image runs with
// GOTOOLCHAIN=local, so an older one fails to build the module.
func TestDockerfileGoVersion(t *testing.T) {
	t.Parallel()
	_, lines := dockerfileCopies(t)
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	require.NoError(t, err)
	var goVersion string
	for line := range strings.Lines(string(gomod)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "go "); ok {
			goVersion = v
		}
	}
	require.NotEmpty(t, goVersion, "go.mod has no go directive")
	require.Contains(t, lines, "ARG GO_VERSION="+goVersion, "the Dockerfile's golang image must be go.mod's Go version")
}

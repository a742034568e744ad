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

// commands are the binaries of the operator (cmd/) and of the sample
// application (examples/orders/cmd/): one per directory, each in its image.
func commands(t testing.TB) []testenv.Command { return testenv.Commands(t, repoRoot) }

// The images' binaries build for both platforms they ship for, static
// (CGO_ENABLED=0), as the Dockerfile builds them.
func TestBinariesBuildForLinux(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("cross-compiling every binary twice takes minutes; not with -short")
	}
	want := testenv.CommandNames(commands(t))
	goCmd := goTool(t)
	for arch, machine := range map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64} {
		t.Run(arch, func(t *testing.T) {
			t.Parallel()
			out := t.TempDir()
			ctx, cancel := buildContext(t)
			defer cancel()
			args := append([]string{"build", "-trimpath", "-ldflags=-s -w -X main.version=test",
				"-o", out + string(filepath.Separator)}, testenv.CommandPatterns()...)
			cmd := exec.CommandContext(ctx, goCmd, args...)
			cmd.Dir = repoRoot
			// GOFLAGS off: a -race from the caller would need cgo.
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOFLAGS=")
			output, err := cmd.CombinedOutput()
			require.NoError(t, err, "GOARCH=%s go build %s:\n%s", arch, strings.Join(testenv.CommandPatterns(), " "), output)

			entries, err := os.ReadDir(out)
			require.NoError(t, err)
			got := make([]string, 0, len(entries))
			for _, e := range entries {
				got = append(got, e.Name())
			}
			require.ElementsMatch(t, want, got, "one binary per directory of %v", testenv.CommandDirs)
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

// dockerfileLines returns the Dockerfile's lines, trimmed.
func dockerfileLines(t testing.TB) (lines []string) {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, "Dockerfile"))
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, strings.TrimSpace(sc.Text()))
	}
	require.NoError(t, sc.Err())
	return lines
}

// sourceDirs are the top-level directories of the module that the packages
// pkgs are built from. It fails the test when one of them embeds a file that
// .dockerignore leaves out.
func sourceDirs(t *testing.T, pkgs ...string) []string {
	t.Helper()
	out, err := run(context.Background(), nil, goTool(t), append([]string{"list", "-deps",
		"-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}|{{join .EmbedFiles \",\"}}{{end}}{{end}}"}, pkgs...)...)
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
	return slices.Compact(dirs)
}

// Each image's build stage copies every directory its binaries are built
// from, and .dockerignore lets each into the context: a new top-level
// package breaks here, not in a Docker build that this machine cannot run.
// The operator's build copies nothing else, the sample (examples/) least of
// all.
func TestDockerfileCopiesEverySourceDir(t *testing.T) {
	t.Parallel()
	lines := dockerfileLines(t)
	ignore, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	require.NoError(t, err)

	// The base images are build arguments (make image-offline substitutes
	// local ones); their defaults are the golang and distroless images.
	require.Contains(t, lines, "ARG BUILDER_IMAGE=golang:${GO_VERSION}")
	require.Contains(t, lines, "FROM --platform=$BUILDPLATFORM ${BUILDER_IMAGE} AS builder")
	require.Contains(t, lines, "ARG RUNTIME_IMAGE=gcr.io/distroless/static:nonroot")

	// Two images, each a non-root distroless image with its binaries at /
	// (/relay is what the controller runs), each built in a stage of its
	// own: the sample's on top of the operator's sources. The operator's is
	// the last stage, so a plain build makes it.
	stages := dockerfileStages(lines)
	require.Equal(t, []string{"builder", "sample-builder", "sample", "operator"}, stageNames(stages))
	dirOf := map[string]string{}
	for _, c := range commands(t) {
		dirOf[c.Name] = c.Dir
	}
	var inImages []string
	for _, want := range []struct {
		stage, builder, entrypoint string
		binaries                   []string
	}{
		{stage: "operator", builder: "builder", entrypoint: "/manager", binaries: []string{"manager", "relay"}},
		{stage: "sample", builder: "sample-builder", entrypoint: "/orders-api", binaries: []string{"orders-api", "worker"}},
	} {
		st := stageNamed(t, stages, want.stage)
		require.Equal(t, "FROM ${RUNTIME_IMAGE} AS "+want.stage, st.lines[0])
		require.Contains(t, st.lines, "USER 65532:65532", want.stage)
		require.Contains(t, st.lines, `ENTRYPOINT ["`+want.entrypoint+`"]`, want.stage)

		builder := stageNamed(t, stages, want.builder)
		build := strings.Join(builder.lines, " ")
		require.Contains(t, build, "CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH}", want.builder)
		var from, pkgs []string
		for _, b := range want.binaries {
			require.Contains(t, dirOf, b, "no directory of %v builds %s", testenv.CommandDirs, b)
			from = append(from, "/out/"+b)
			pkgs = append(pkgs, "./"+dirOf[b])
			require.Contains(t, build, "./"+dirOf[b], "the stage %s does not build %s", want.builder, dirOf[b])
		}
		require.Contains(t, st.lines, "COPY --from="+want.builder+" "+strings.Join(from, " ")+" /", want.stage)
		inImages = append(inImages, want.binaries...)

		copied := stageCopies(t, stages, want.builder)
		dirs := sourceDirs(t, pkgs...)
		for _, d := range dirs {
			require.Contains(t, copied, d, "the stage %s does not COPY %s/, which %v are built from", want.builder, d, want.binaries)
			require.Contains(t, strings.Split(string(ignore), "\n"), "!"+d+"/**",
				".dockerignore keeps %s/ out of the build context", d)
		}
		if want.stage == "operator" {
			require.ElementsMatch(t, dirs, copied, "the operator's build copies only what its binaries are built from")
		}
	}
	// Every command but the kubectl plugin (a client, installed with krew)
	// is in one of the two images.
	var want []string
	for _, c := range commands(t) {
		if c.Name != "kubectl-outbox" {
			want = append(want, c.Name)
		}
	}
	require.ElementsMatch(t, want, inImages, "every command of %v but kubectl-outbox is in one image", testenv.CommandDirs)
}

// stage is one FROM of the Dockerfile and the lines up to the next: base is
// the image or the stage it starts from.
type stage struct {
	name, base string
	lines      []string
}

func dockerfileStages(lines []string) []stage {
	var stages []stage
	for _, l := range lines {
		if strings.HasPrefix(l, "FROM ") {
			f := strings.Fields(l)
			stages = append(stages, stage{name: f[len(f)-1], base: f[len(f)-3]})
		}
		if len(stages) > 0 && l != "" && !strings.HasPrefix(l, "#") {
			stages[len(stages)-1].lines = append(stages[len(stages)-1].lines, l)
		}
	}
	return stages
}

func stageNamed(t *testing.T, stages []stage, name string) stage {
	t.Helper()
	i := slices.IndexFunc(stages, func(s stage) bool { return s.name == name })
	require.GreaterOrEqual(t, i, 0, "the Dockerfile has no stage %s", name)
	return stages[i]
}

// stageCopies are the directories the stage name and the stages it starts
// from copy from the build context (COPY <dir>/ <dir>/).
func stageCopies(t *testing.T, stages []stage, name string) []string {
	t.Helper()
	var copies []string
	for st := stageNamed(t, stages, name); ; st = stageNamed(t, stages, st.base) {
		for _, l := range st.lines {
			f := strings.Fields(l)
			if len(f) == 3 && f[0] == "COPY" && strings.HasSuffix(f[1], "/") && f[1] == f[2] {
				copies = append(copies, strings.TrimSuffix(f[1], "/"))
			}
		}
		if !slices.ContainsFunc(stages, func(s stage) bool { return s.name == st.base }) {
			return copies
		}
	}
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
	lines := dockerfileLines(t)
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

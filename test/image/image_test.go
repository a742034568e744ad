//go:build image

package image

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-dev/outbox-operator/internal/testenv"
)

// repoRoot is the repository, seen from this package's directory.
var repoRoot = testenv.RepoRoot(2)

const (
	// nonRoot is distroless's "nonroot" user and group, the image's USER.
	nonRoot = 65532
	// containerPrefix names the buildah working containers (and runc
	// containers) of these tests, so that a run can remove what a killed run
	// left behind.
	containerPrefix = "outbox-image-test-"
	// runTimeout bounds one container run.
	runTimeout = 2 * time.Minute
)

// ociImage is the part of an OCI image configuration the tests read.
type ociImage struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Config       struct {
		User       string            `json:"User"`
		Entrypoint []string          `json:"Entrypoint"`
		Cmd        []string          `json:"Cmd"`
		Env        []string          `json:"Env"`
		WorkingDir string            `json:"WorkingDir"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
}

// descriptor is an OCI content descriptor.
type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
}

// imageSpec is one image of the Dockerfile: the operator's or the sample's.
type imageSpec struct {
	target     string // the Dockerfile's stage
	imgEnv     string // the variable naming the image, and its default
	img        string
	archiveEnv string // the variable naming its OCI archive, and its default
	archive    string
	entrypoint string   // the binary the image starts
	binaries   []string // every binary in the image, at /
}

// images are the two images make image-offline builds; every command of cmd/
// (the operator's) and of examples/orders/cmd/ (the sample's) but the kubectl
// plugin (a client) is in one of them.
var images = []imageSpec{
	{
		target: "operator", imgEnv: "IMG", img: "ghcr.io/outbox-dev/outbox-operator:dev",
		archiveEnv: "IMAGE_ARCHIVE", archive: "outbox-operator.oci.tar",
		entrypoint: "manager", binaries: []string{"manager", "relay"},
	},
	{
		target: "sample", imgEnv: "SAMPLE_IMG", img: "ghcr.io/outbox-dev/outbox-operator-sample:dev",
		archiveEnv: "SAMPLE_IMAGE_ARCHIVE", archive: "outbox-operator-sample.oci.tar",
		entrypoint: "orders-api", binaries: []string{"orders-api", "worker"},
	},
}

// testBundle is the image under test: its configuration (from the OCI
// archive), its root file system (a buildah working container, mounted), the
// probe and a runc state directory of this test's own.
type testBundle struct {
	spec     imageSpec
	img      string
	config   ociImage
	rootfs   string
	probe    string
	runcRoot string
	runs     atomic.Int64
}

// setup finds the tools and the image, removes what a killed run left behind,
// checks the archive against buildah's image, mounts the image's root file
// system and builds the probe. Everything it creates goes at the test's end,
// also when the test fails.
func setup(t *testing.T, spec imageSpec) *testBundle {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "the image test needs root (buildah's storage, runc): run `sudo make test-image`")
	}
	for _, tool := range []string{"buildah", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, "%s is not installed: apt-get install -y buildah runc (make image-offline installs them)", tool)
		}
	}
	img := cmp.Or(os.Getenv(spec.imgEnv), spec.img)
	archive := cmp.Or(os.Getenv(spec.archiveEnv), filepath.Join(repoRoot, "bin", "images", spec.archive))

	removeLeftovers(t)

	imageID, err := output(t, "buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", img)
	if err != nil {
		testenv.Missing(t, "the image %s is not in buildah's storage (%v): build it with `make image-offline` "+
			"(make test-image does it first)", img, err)
	}
	if _, err := os.Stat(archive); err != nil {
		testenv.Missing(t, "the OCI archive %s is missing (%v): build it with `make image-offline`", archive, err)
	}
	b := &testBundle{spec: spec, img: img, runcRoot: t.TempDir()}
	b.config = readArchive(t, archive, img, "sha256:"+strings.TrimSpace(imageID))

	name := containerPrefix + strconv.Itoa(os.Getpid()) + "-" + spec.target
	_, err = output(t, "buildah", "from", "--pull=never", "--quiet", "--name", name, img)
	require.NoError(t, err)
	t.Cleanup(func() {
		if _, err := output(t, "buildah", "rm", name); err != nil {
			t.Errorf("removing the working container %s: %v", name, err)
		}
	})
	mount, err := output(t, "buildah", "mount", name)
	require.NoError(t, err)
	b.rootfs = strings.TrimSpace(mount)

	b.probe = filepath.Join(t.TempDir(), "probe")
	build := exec.Command("go", "build", "-trimpath", "-o", b.probe, "./probe")
	// Static, for an image without libc; GOFLAGS off: a -race would need cgo.
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "building the probe:\n%s", out)

	t.Cleanup(func() { b.removeContainers(t) })
	return b
}

// removeLeftovers removes the buildah working containers of earlier runs that
// were killed before their cleanup ran.
func removeLeftovers(t *testing.T) {
	t.Helper()
	out, err := output(t, "buildah", "containers", "--noheading", "--format", "{{.ContainerName}}")
	require.NoError(t, err)
	for _, name := range strings.Fields(out) {
		if strings.HasPrefix(name, containerPrefix) {
			t.Logf("removing the working container %s of an earlier run", name)
			_, _ = output(t, "buildah", "rm", name)
		}
	}
}

// removeContainers deletes every runc container in this test's state
// directory (a run cut short by its timeout leaves one).
func (b *testBundle) removeContainers(t *testing.T) {
	t.Helper()
	out, err := output(t, "runc", "--root", b.runcRoot, "list", "--quiet")
	if err != nil {
		t.Errorf("runc list: %v", err)
		return
	}
	for _, id := range strings.Fields(out) {
		if _, err := output(t, "runc", "--root", b.runcRoot, "delete", "--force", id); err != nil {
			t.Errorf("runc delete %s: %v", id, err)
		}
	}
}

// readArchive reads the OCI archive: its index names img, and the manifest's
// configuration is the image buildah holds (wantConfig, the image ID); every
// blob is in the archive with its size. It returns the configuration.
func readArchive(t *testing.T, archive, img, wantConfig string) ociImage {
	t.Helper()
	f, err := os.Open(archive)
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	files := map[string][]byte{}
	sizes := map[string]int64{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		name := strings.TrimPrefix(h.Name, "./")
		sizes[name] = h.Size
		// Layers are only sized; the small JSON files are read.
		if name == "index.json" || name == "oci-layout" || h.Size < 1<<20 {
			files[name], err = io.ReadAll(tr)
			require.NoError(t, err)
		}
	}
	require.Contains(t, files, "oci-layout", "%s is not an OCI image layout", archive)

	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	require.NoError(t, json.Unmarshal(files["index.json"], &index))
	var manifest *descriptor
	for i, m := range index.Manifests {
		if m.Annotations["org.opencontainers.image.ref.name"] == img {
			manifest = &index.Manifests[i]
		}
	}
	require.NotNil(t, manifest, "the archive's index.json names no image %s: %s", img, files["index.json"])
	blob := func(d descriptor) []byte {
		path := "blobs/" + strings.Replace(d.Digest, ":", "/", 1)
		require.Contains(t, sizes, path, "the archive lacks the blob %s", d.Digest)
		require.Equal(t, d.Size, sizes[path], "the blob %s has the wrong size", d.Digest)
		return files[path]
	}
	var m struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	require.NoError(t, json.Unmarshal(blob(*manifest), &m))
	require.Equal(t, wantConfig, m.Config.Digest,
		"the archive is not the image in buildah's storage: rebuild it with `make image-offline`")
	require.NotEmpty(t, m.Layers)
	for _, l := range m.Layers {
		blob(l)
	}
	var config ociImage
	require.NoError(t, json.Unmarshal(blob(m.Config), &config))
	return config
}

// run runs args in the image with runc, as a runtime would: the image's user
// and environment, a read-only root file system, no capabilities, its own
// namespaces; the probe is bind-mounted at /probe. It returns stdout, stderr
// and the exit code.
func (b *testBundle) run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	uid, gid := parseUser(t, b.config.Config.User)
	id := containerPrefix + strconv.Itoa(os.Getpid()) + "-" + b.spec.target + "-" + strconv.FormatInt(b.runs.Add(1), 10)
	dir := t.TempDir()
	spec := runtimeSpec(b.rootfs, b.probe, uid, gid, b.config.Config.Env, cmp.Or(b.config.Config.WorkingDir, "/"), args)
	data, err := json.MarshalIndent(spec, "", "  ")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600))

	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, "runc", "--root", b.runcRoot, "run", "--bundle", dir, id)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && ctx.Err() == nil:
		code = exit.ExitCode()
	default:
		t.Fatalf("runc run %v: %v\nstdout:\n%s\nstderr:\n%s", args, err, out.String(), errOut.String())
	}
	return out.String(), errOut.String(), code
}

// parseUser reads a numeric "uid:gid" (or "uid") image user.
func parseUser(t *testing.T, user string) (uid, gid int) {
	t.Helper()
	u, g, found := strings.Cut(user, ":")
	uid, err := strconv.Atoi(u)
	require.NoError(t, err, "the image's user %q is not numeric", user)
	gid = uid
	if found {
		gid, err = strconv.Atoi(g)
		require.NoError(t, err, "the image's group in %q is not numeric", user)
	}
	return uid, gid
}

// runtimeSpec is an OCI runtime configuration (config.json) for args in
// rootfs: what `runc spec` writes, made stricter (read-only root, no
// capabilities, no new privileges), without rlimits and oom_score_adj (a
// machine may forbid changing them).
func runtimeSpec(rootfs, probe string, uid, gid int, env []string, cwd string, args []string) map[string]any {
	return map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"terminal": false,
			"user":     map[string]any{"uid": uid, "gid": gid},
			"args":     args,
			"env":      env,
			"cwd":      cwd,
			"capabilities": map[string]any{"bounding": []string{}, "effective": []string{}, "permitted": []string{},
				"inheritable": []string{}, "ambient": []string{}},
			"noNewPrivileges": true,
		},
		"root":     map[string]any{"path": rootfs, "readonly": true},
		"hostname": "image-test",
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "noexec", "nodev", "ro"}},
			{"destination": "/probe", "type": "bind", "source": probe, "options": []string{"bind", "ro", "nosuid", "nodev"}},
		},
		"linux": map[string]any{
			"namespaces": []map[string]string{{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}},
			"maskedPaths": []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"},
			"readonlyPaths": []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
}

// commands are the binaries of the operator (cmd/) and of the sample
// (examples/orders/cmd/), one per directory.
func commands(t testing.TB) []string { return testenv.CommandNames(testenv.Commands(t, repoRoot)) }

// Every command but the kubectl plugin is in exactly one image.
func TestImagesHoldEveryCommand(t *testing.T) {
	var inImages []string
	for _, spec := range images {
		inImages = append(inImages, spec.binaries...)
	}
	var want []string
	for _, c := range commands(t) {
		if c != "kubectl-outbox" {
			want = append(want, c)
		}
	}
	require.ElementsMatch(t, want, inImages)
}

func TestImage(t *testing.T) {
	for _, spec := range images {
		// One image after the other: each removes its working container
		// and runc containers at its end.
		t.Run(spec.target, func(t *testing.T) { testImage(t, setup(t, spec)) })
	}
}

func testImage(t *testing.T, b *testBundle) {
	// What the Dockerfile says, as the archive containerd imports has it.
	t.Run("Config", func(t *testing.T) {
		c := b.config
		require.Equal(t, "linux", c.OS)
		require.Equal(t, runtime.GOARCH, c.Architecture)
		require.Equal(t, []string{"/" + b.spec.entrypoint}, c.Config.Entrypoint)
		require.Empty(t, c.Config.Cmd)
		require.Equal(t, "65532:65532", c.Config.User)
		require.Equal(t, "https://github.com/outbox-dev/outbox-operator", c.Config.Labels["org.opencontainers.image.source"])
		require.Contains(t, c.Config.Env, "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt", "the runtime base's environment")
	})

	// Its static binaries at /, owned by root and not writable by the user;
	// none of the other image's, no shell.
	t.Run("Files", func(t *testing.T) {
		for _, name := range b.spec.binaries {
			path := filepath.Join(b.rootfs, name)
			info, err := os.Stat(path)
			require.NoError(t, err, "the image has no /%s", name)
			require.True(t, info.Mode().IsRegular(), "/%s", name)
			require.Equal(t, os.FileMode(0o755), info.Mode().Perm(), "/%s", name)
			f, err := elf.Open(path)
			require.NoError(t, err, "/%s", name)
			for _, p := range f.Progs {
				require.NotEqual(t, elf.PT_INTERP, p.Type, "/%s is dynamically linked", name)
			}
			require.NoError(t, f.Close())
		}
		for _, name := range commands(t) {
			if !slices.Contains(b.spec.binaries, name) {
				_, err := os.Lstat(filepath.Join(b.rootfs, name))
				require.ErrorIs(t, err, os.ErrNotExist, "the %s image holds /%s, which it does not run", b.spec.target, name)
			}
		}
		for _, sh := range []string{"bin/sh", "bin/bash", "bin/busybox"} {
			_, err := os.Lstat(filepath.Join(b.rootfs, sh))
			require.ErrorIs(t, err, os.ErrNotExist, "the image has /%s; the runtime base has no shell", sh)
		}
	})

	// The process runs as 65532:65532 on a read-only root, and the runtime
	// base gives it what distroless static does.
	t.Run("Process", func(t *testing.T) {
		t.Parallel()
		stdout, stderr, code := b.run(t, "/probe")
		require.Zero(t, code, "the probe failed:\n%s%s", stdout, stderr)
		var r ProbeReport
		require.NoError(t, json.Unmarshal([]byte(stdout), &r), "the probe's report:\n%s%s", stdout, stderr)
		t.Logf("probe: uid=%d gid=%d groups=%v user=%s home=%s ca=%d", r.UID, r.GID, r.Groups, r.UserName, r.HomeDir, r.CACertificates)

		require.Equal(t, nonRoot, r.UID)
		require.Equal(t, nonRoot, r.EUID)
		require.Equal(t, nonRoot, r.GID)
		require.Equal(t, nonRoot, r.EGID)
		require.Equal(t, "nonroot", r.UserName, "/etc/passwd names 65532")
		require.Equal(t, "/home/nonroot", r.HomeDir)
		require.Contains(t, r.WriteErrors["/probe-write-test"], "read-only file system")
		for path, e := range r.WriteErrors {
			require.NotEmpty(t, e, "the process could write %s", path)
		}
		require.Greater(t, r.CACertificates, 10, "CA certificates at SSL_CERT_FILE")
		require.Empty(t, r.TimeZone, "tzdata: loading Europe/Berlin")
		require.Empty(t, r.Shell)
		for _, name := range b.spec.binaries {
			require.Contains(t, r.RootEntries, name)
		}
	})

	// Every binary starts: --help exits 0 with its usage. The entrypoint runs
	// as such.
	for _, name := range b.spec.binaries {
		t.Run("Help/"+name, func(t *testing.T) {
			t.Parallel()
			args := []string{"/" + name, "--help"}
			if name == b.spec.entrypoint {
				args = append(slices.Clone(b.config.Config.Entrypoint), "--help")
			}
			stdout, stderr, code := b.run(t, args...)
			out := stdout + stderr
			require.Zero(t, code, "%v exited %d:\n%s", args, code, out)
			require.Contains(t, strings.ToLower(out), "usage", "%v printed no usage:\n%s", args, out)
			if name == "relay" {
				for _, sub := range []string{"run", "cleanup", "backlog", "schema"} {
					require.Regexp(t, `(?m)^\s+`+sub+`\s`, out, "relay --help lists the command %s", sub)
				}
			}
		})
	}
}

// output runs a command and returns its stdout; the error carries stderr.
func output(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), errors.New(strings.TrimSpace(name + " " + strings.Join(args, " ") + ": " + err.Error() + ": " + stderr.String()))
	}
	return string(out), nil
}

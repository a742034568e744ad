package podspec

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Image is an image whose containers the node can run: its binaries, built
// from this repo into one dir, stand for the files of the image's root.
type Image struct {
	// Repository without tag or digest, e.g. ghcr.io/outbox-dev/outbox-operator.
	Repository string
	// Entrypoint is the image's ENTRYPOINT, used when a container sets no command.
	Entrypoint []string
	// Binaries are the executables at the image's root (/manager, /relay, ...).
	Binaries []string
	// User is the image's USER: the uid a container runs as without runAsUser.
	User, Group int64
}

// ImageError is an image the node cannot run (it pulls nothing).
type ImageError struct{ Msg string }

func (e *ImageError) Error() string { return e.Msg }

// Repository strips the tag and digest of an image reference.
func Repository(image string) string {
	if i := strings.IndexByte(image, '@'); i >= 0 {
		image = image[:i]
	}
	slash := strings.LastIndexByte(image, '/')
	if colon := strings.LastIndexByte(image, ':'); colon > slash {
		image = image[:colon]
	}
	return image
}

// Process is what runs for one container.
type Process struct {
	Path string   // the binary on the host
	Args []string // argv[1:]
	Env  []EnvVar
	UID  int64
	GID  int64
}

// Command maps container c to the host binary in binDir and its arguments,
// with $(VAR) in command and args expanded against env, as the kubelet does.
func Command(c *corev1.Container, images []Image, binDir string, env []EnvVar) (string, []string, error) {
	img, err := findImage(c.Image, images)
	if err != nil {
		return "", nil, err
	}
	lookup := MapLookup(env)
	expand := func(in []string) []string {
		out := make([]string, len(in))
		for i, s := range in {
			out[i] = Expand(s, lookup)
		}
		return out
	}
	argv := expand(c.Command)
	args := expand(c.Args)
	if len(argv) == 0 {
		argv = slices.Clone(img.Entrypoint)
	}
	if len(argv) == 0 {
		return "", nil, configErrorf("container %s sets no command and image %s has no entrypoint", c.Name, c.Image)
	}
	name := filepath.Clean("/" + argv[0])
	if !slices.Contains(img.Binaries, name) {
		return "", nil, configErrorf("container %s runs %q, which image %s does not hold (it holds %s)",
			c.Name, argv[0], img.Repository, strings.Join(img.Binaries, ", "))
	}
	return filepath.Join(binDir, strings.TrimPrefix(name, "/")), append(argv[1:], args...), nil
}

func findImage(ref string, images []Image) (Image, error) {
	repo := Repository(ref)
	for _, img := range images {
		if img.Repository == repo {
			return img, nil
		}
	}
	known := make([]string, len(images))
	for i, img := range images {
		known[i] = img.Repository
	}
	return Image{}, &ImageError{Msg: fmt.Sprintf("image %q is not one the local cluster can run: "+
		"it pulls no images and runs only %s, from binaries built from this repo", ref, strings.Join(known, ", "))}
}

// RunAs returns the uid and gid of container c: runAsUser/runAsGroup of the
// container, else of the pod, else the image's user; runAsNonRoot with uid 0
// is a config error, as in the kubelet.
func RunAs(pod *corev1.Pod, c *corev1.Container, images []Image) (uid, gid int64, err error) {
	img, err := findImage(c.Image, images)
	if err != nil {
		return 0, 0, err
	}
	uid, gid = img.User, img.Group
	nonRoot := false
	if psc := pod.Spec.SecurityContext; psc != nil {
		if psc.RunAsUser != nil {
			uid = *psc.RunAsUser
		}
		if psc.RunAsGroup != nil {
			gid = *psc.RunAsGroup
		}
		nonRoot = optional(psc.RunAsNonRoot)
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = *sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = *sc.RunAsGroup
		}
		if sc.RunAsNonRoot != nil {
			nonRoot = *sc.RunAsNonRoot
		}
	}
	if nonRoot && uid == 0 {
		return 0, 0, configErrorf("container has runAsNonRoot and image will run as root (pod: %q, container: %s)", pod.Name, c.Name)
	}
	return uid, gid, nil
}

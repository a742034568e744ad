package kubelet

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// OCI media types of the archive WriteImageArchive writes.
const (
	mediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	mediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	mediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar"
)

// ImageFile is one file of a single-layer image.
type ImageFile struct {
	Path string // absolute path in the image, e.g. /pause
	Data []byte
	Mode int64
}

// Image is a single-layer image made from files on this machine: the pause
// image (no registry can be reached to pull one).
type Image struct {
	Name       string // e.g. localhost/outbox-local-cluster/pause:3.10
	Entrypoint []string
	User       string
	Files      []ImageFile
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int               `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    map[string]string `json:"platform,omitempty"`
}

// WriteImageArchive writes img as an OCI image layout in a tar archive at path,
// which `ctr images import` takes; the image's name is the index's
// io.containerd.image.name annotation.
func WriteImageArchive(path string, img Image) error {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	epoch := time.Unix(0, 0)
	for _, f := range img.Files {
		name := strings.TrimPrefix(f.Path, "/")
		hdr := &tar.Header{Name: name, Mode: f.Mode, Size: int64(len(f.Data)), ModTime: epoch, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	blobs := map[string][]byte{}
	put := func(b []byte) string {
		sum := sha256.Sum256(b)
		d := "sha256:" + hex.EncodeToString(sum[:])
		blobs[d] = b
		return d
	}
	layerDigest := put(layer.Bytes())
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Entrypoint": img.Entrypoint, "User": img.User},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}}, //nolint:goconst // the OCI config's key, not the CNI one
	})
	if err != nil {
		return err
	}
	configDigest := put(config)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": mediaTypeManifest,
		"config": descriptor{MediaType: mediaTypeConfig, Digest: configDigest, Size: len(config)},
		"layers": []descriptor{{MediaType: mediaTypeLayer, Digest: layerDigest, Size: layer.Len()}},
	})
	if err != nil {
		return err
	}
	manifestDigest := put(manifest)
	tag := img.Name[strings.LastIndex(img.Name, ":")+1:]
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": mediaTypeIndex,
		"manifests": []descriptor{{
			MediaType: mediaTypeManifest, Digest: manifestDigest, Size: len(manifest),
			Annotations: map[string]string{"io.containerd.image.name": img.Name, "org.opencontainers.image.ref.name": tag},
			Platform:    map[string]string{"architecture": "amd64", "os": "linux"},
		}},
	})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	out := tar.NewWriter(f)
	add := func(name string, b []byte) error {
		if err := out.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := out.Write(b)
		return err
	}
	files := []struct {
		name string
		data []byte
	}{{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)}, {"index.json", index}}
	for d, b := range blobs {
		files = append(files, struct {
			name string
			data []byte
		}{"blobs/sha256/" + strings.TrimPrefix(d, "sha256:"), b})
	}
	for _, e := range files {
		if err := add(e.name, e.data); err != nil {
			_ = f.Close()
			return err
		}
	}
	if err := out.Close(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// ImportImage imports an OCI archive into containerd's CRI namespace, so the
// kubelet finds its image without pulling. Importing the same archive again
// is a no-op.
func ImportImage(ctx context.Context, c Config, archive string) error {
	cmd := exec.CommandContext(ctx, "ctr", "--address", c.ContainerdSocket(), "--namespace", CRINamespace,
		"images", "import", archive)
	b, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr images import %s: %w: %s", archive, err, strings.TrimSpace(string(b)))
	}
	return nil
}

// Images lists the names of the images containerd holds for the kubelet.
func Images(ctx context.Context, c Config) ([]string, error) {
	b, err := exec.CommandContext(ctx, "ctr", "--address", c.ContainerdSocket(), "--namespace", CRINamespace,
		"images", "list", "--quiet").Output()
	if err != nil {
		return nil, fmt.Errorf("ctr images list: %w", err)
	}
	return strings.Fields(string(b)), nil
}

// WriteProgramArchive packs one static program into image name at path:
// the program alone, at /<its file name>, as the entrypoint, run as user.
func WriteProgramArchive(path, name, binary, user string) error {
	b, err := os.ReadFile(binary)
	if err != nil {
		return fmt.Errorf("the image %s: %w", name, err)
	}
	entry := "/" + filepath.Base(binary)
	return WriteImageArchive(path, Image{
		Name: name, Entrypoint: []string{entry}, User: user,
		Files: []ImageFile{{Path: entry, Data: b, Mode: 0o755}},
	})
}

// writePauseArchive packs the pause program into PauseImage, as user 65535
// like the upstream pause image.
func writePauseArchive(binary, path string) error {
	return WriteProgramArchive(path, PauseImage, binary, "65535:65535")
}

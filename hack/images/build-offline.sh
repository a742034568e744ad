#!/usr/bin/env bash
# build-offline.sh builds the operator's and the sample's images from the repository's Dockerfile on a
# machine with no Docker engine and no reachable container registry (`make
# image-offline`). The Dockerfile's build steps run unchanged; only its two base
# images, the build arguments BUILDER_IMAGE and RUNTIME_IMAGE, are replaced by
# equivalents made here from the host:
#
#   builder  localhost/outbox-operator-offline/golang:<go version>
#            FROM scratch: the host's Go (GOROOT, /usr/local/go), busybox (Debian's
#            busybox-static) as /bin/sh for the RUN steps, the host's CA
#            certificates, and the golang image's environment (GOPATH=/go,
#            GOTOOLCHAIN=local). The Dockerfile's `go mod download` fetches the
#            modules from the Go module proxy (the host's GOPROXY), over TLS with those
#            certificates, into the Dockerfile's cache mount, which buildah keeps
#            between builds; so only the first build downloads.
#   runtime  localhost/outbox-operator-offline/distroless-static:nonroot
#            FROM scratch: what gcr.io/distroless/static:nonroot holds: CA
#            certificates, tzdata (/usr/share/zoneinfo), /etc/passwd and /etc/group
#            with root, nobody and nonroot (65532), /home/nonroot, /tmp; user 65532,
#            no shell.
#
# Then `buildah bud` builds the Dockerfile with those two as build arguments into
# buildah's local storage: its target operator as IMG and its target sample as
# SAMPLE_IMG, and writes an OCI archive of each (IMAGE_ARCHIVE, SAMPLE_IMAGE_ARCHIVE),
# which containerd imports: ctr -n k8s.io images import <archive>.
#
# It is idempotent: a base image is rebuilt only when its inputs changed (its
# recipe below, the Go version, the Debian packages it copies from, GOPROXY;
# recorded in a label), the image's layers come from buildah's layer cache (--layers), and the
# archive is rewritten only when the image's ID changed.
#
# Needs root (buildah's storage in /var/lib/containers, chroot isolation) and the
# Debian packages buildah, runc, busybox-static, ca-certificates and tzdata; as root
# it installs the missing ones with apt-get.
#
# Environment: IMG (ghcr.io/outbox-dev/outbox-operator:dev), VERSION (dev),
# IMAGE_ARCHIVE (bin/images/outbox-operator.oci.tar), SAMPLE_IMG
# (ghcr.io/outbox-dev/outbox-operator-sample:dev, the Dockerfile's target sample),
# SAMPLE_IMAGE_ARCHIVE (bin/images/outbox-operator-sample.oci.tar), GOROOT (the go on PATH's),
# OFFLINE_BUILDER_IMAGE, OFFLINE_RUNTIME_IMAGE (the names above).
set -euo pipefail

log() { printf 'build-offline: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

IMG="${IMG:-ghcr.io/outbox-dev/outbox-operator:dev}"
VERSION="${VERSION:-dev}"
IMAGE_ARCHIVE="${IMAGE_ARCHIVE:-${repo_root}/bin/images/outbox-operator.oci.tar}"
SAMPLE_IMG="${SAMPLE_IMG:-ghcr.io/outbox-dev/outbox-operator-sample:dev}"
SAMPLE_IMAGE_ARCHIVE="${SAMPLE_IMAGE_ARCHIVE:-${repo_root}/bin/images/outbox-operator-sample.oci.tar}"
OFFLINE_RUNTIME_IMAGE="${OFFLINE_RUNTIME_IMAGE:-localhost/outbox-operator-offline/distroless-static:nonroot}"

# inputs_label is the label holding the fingerprint of a base image's inputs.
inputs_label=dev.outbox-operator.offline.inputs

### Preconditions: root, packages, Go.

if [[ "$(id -u)" -ne 0 ]]; then
	die "needs root (buildah's image storage in /var/lib/containers and its chroot isolation): run it as root, e.g. sudo make image-offline"
fi

# packages maps each Debian package to a file it must have left on this machine.
declare -A packages=(
	[buildah]=/usr/bin/buildah
	[runc]=/usr/sbin/runc
	[busybox-static]=/bin/busybox
	[ca-certificates]=/etc/ssl/certs/ca-certificates.crt
	[tzdata]=/usr/share/zoneinfo/UTC
)
installed() { [[ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" == installed && -e "${packages[$1]}" ]]; }
missing=()
for p in buildah runc busybox-static ca-certificates tzdata; do
	installed "${p}" || missing+=("${p}")
done
if ((${#missing[@]} > 0)); then
	log "missing Debian packages: ${missing[*]}; installing them with apt-get"
	export DEBIAN_FRONTEND=noninteractive
	apt-get -o DPkg::Lock::Timeout=600 update >&2 || true
	apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${missing[@]}" >&2 ||
		die "apt-get could not install ${missing[*]}; install them by hand: apt-get install -y --no-install-recommends ${missing[*]}"
	for p in "${missing[@]}"; do
		installed "${p}" || die "${p} is still missing after apt-get install (${packages[${p}]} not found)"
	done
fi

GOROOT="${GOROOT:-$(go env GOROOT 2>/dev/null || true)}"
[[ -n "${GOROOT}" && -x "${GOROOT}/bin/go" && -f "${GOROOT}/VERSION" ]] ||
	die "no Go toolchain found (GOROOT=${GOROOT:-unset}); install Go (https://go.dev/doc/install) into /usr/local/go or set GOROOT"
go_version="$(head -n1 "${GOROOT}/VERSION")" # go1.26.8
go_version="${go_version#go}"
want_go="$(sed -n 's/^ARG GO_VERSION=//p' "${repo_root}/Dockerfile")"
if [[ "${go_version}" != "${want_go}" ]]; then
	log "note: the host's Go is ${go_version}, the Dockerfile's GO_VERSION is ${want_go}; the builder image uses the host's"
fi
goproxy="$("${GOROOT}/bin/go" env GOPROXY)"
OFFLINE_BUILDER_IMAGE="${OFFLINE_BUILDER_IMAGE:-localhost/outbox-operator-offline/golang:${go_version}}"

pkg_version() { dpkg-query -W -f='${Package}=${Version}' "$1"; }
fingerprint() { printf '%s\n' "$@" | sha256sum | cut -d' ' -f1; }

# image_inputs prints the fingerprint label of a local image, nothing when it is absent.
image_inputs() {
	buildah inspect --type image --format "{{index .OCIv1.Config.Labels \"${inputs_label}\"}}" "$1" 2>/dev/null || true
}

# work_ctr is the working container of the base image being built; removed on exit.
work_ctr=""
cleanup() {
	if [[ -n "${work_ctr}" ]]; then
		buildah rm "${work_ctr}" >/dev/null 2>&1 || true
	fi
}
trap cleanup EXIT

# base_image NAME FINGERPRINT POPULATE CONFIG... builds NAME from scratch, unless an
# image of that name with the same fingerprint exists: POPULATE fills the mounted
# root file system (its argument), CONFIG are the flags of buildah config.
base_image() {
	local name="$1" inputs="$2" populate="$3"
	shift 3
	# The recipe is part of the inputs: the populating functions and the config.
	inputs="$(fingerprint "${inputs}" "$(declare -f passwd_files "${populate}")" "$@")"
	if [[ "$(image_inputs "${name}")" == "${inputs}" ]]; then
		log "reusing ${name}"
		return
	fi
	log "building ${name}"
	work_ctr="$(buildah from --quiet scratch)"
	local root
	root="$(buildah mount "${work_ctr}")"
	"${populate}" "${root}"
	buildah umount "${work_ctr}" >/dev/null
	buildah config --label "${inputs_label}=${inputs}" --created-by "hack/images/build-offline.sh" "$@" "${work_ctr}"
	buildah commit --quiet --rm "${work_ctr}" "${name}" >/dev/null
	work_ctr=""
}

# passwd_files writes /etc/passwd and /etc/group as distroless has them.
passwd_files() {
	local root="$1"
	mkdir -p "${root}/etc"
	cat >"${root}/etc/passwd" <<-'EOF'
		root:x:0:0:root:/root:/sbin/nologin
		nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
		nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
	EOF
	cat >"${root}/etc/group" <<-'EOF'
		root:x:0:
		nobody:x:65534:
		tty:x:5:
		staff:x:50:
		nonroot:x:65532:
	EOF
	chmod 0644 "${root}/etc/passwd" "${root}/etc/group"
	install -d -m 0700 "${root}/root"
	install -d -m 1777 "${root}/tmp"
	install -d -m 0755 "${root}/etc/ssl/certs"
	install -m 0644 /etc/ssl/certs/ca-certificates.crt "${root}/etc/ssl/certs/ca-certificates.crt"
}

populate_builder() {
	local root="$1" applet
	passwd_files "${root}"
	install -d -m 0755 "${root}/bin" "${root}/usr/local"
	install -m 0755 /bin/busybox "${root}/bin/busybox"
	for applet in $(/bin/busybox --list); do
		[[ -e "${root}/bin/${applet}" ]] || ln -s busybox "${root}/bin/${applet}"
	done
	cp -a "${GOROOT}/." "${root}/usr/local/go/"
	# As in the golang image: GOPATH=/go, writable by every user.
	install -d -m 1777 "${root}/go" "${root}/go/bin" "${root}/go/src"
}

populate_runtime() {
	local root="$1"
	passwd_files "${root}"
	install -d -m 0700 -o 65532 -g 65532 "${root}/home/nonroot"
	install -d -m 0755 "${root}/usr/share"
	cp -a /usr/share/zoneinfo "${root}/usr/share/zoneinfo"
}

base_image "${OFFLINE_BUILDER_IMAGE}" \
	"$(fingerprint "go${go_version}" "${GOROOT}" "GOPROXY=${goproxy}" \
		"$(pkg_version busybox-static)" "$(pkg_version ca-certificates)")" \
	populate_builder \
	--env PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	--env GOLANG_VERSION="${go_version}" --env GOTOOLCHAIN=local --env GOPATH=/go \
	--env GOPROXY="${goproxy}" --env HOME=/root \
	--workingdir /go --cmd /bin/sh

base_image "${OFFLINE_RUNTIME_IMAGE}" \
	"$(fingerprint "$(pkg_version ca-certificates)" "$(pkg_version tzdata)")" \
	populate_runtime \
	--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	--env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
	--user 65532 --workingdir /home/nonroot

### The images, from the Dockerfile as it is.

# build_image TARGET NAME ARCHIVE builds the Dockerfile's stage TARGET as NAME
# and writes its OCI archive, for containerd, to ARCHIVE (kept when the image
# did not change). What `make docker-build CONTAINER_TOOL=buildah` runs, with
# the local bases and --pull=never: nothing is looked up in a registry. buildah
# 1.28 sets no TARGETOS/TARGETARCH; they are the host's (the builder's Go, on
# the host's platform). The sample's build (its stage sample-builder starts
# from the operator's stage builder and adds examples/) reuses the first
# build's layers from buildah's layer cache.
build_image() {
	local target="$1" name="$2" archive="$3" image_id
	log "building ${name} (target ${target}) from ${repo_root}/Dockerfile"
	buildah bud --isolation chroot --layers --pull=never \
		--build-arg TARGETOS="$("${GOROOT}/bin/go" env GOOS)" \
		--build-arg TARGETARCH="$("${GOROOT}/bin/go" env GOARCH)" \
		--build-arg BUILDER_IMAGE="${OFFLINE_BUILDER_IMAGE}" \
		--build-arg RUNTIME_IMAGE="${OFFLINE_RUNTIME_IMAGE}" \
		--build-arg VERSION="${VERSION}" \
		--target "${target}" --tag "${name}" --file "${repo_root}/Dockerfile" "${repo_root}" >&2

	image_id="$(buildah inspect --type image --format '{{.FromImageID}}' "${name}")"
	mkdir -p "$(dirname "${archive}")"
	if [[ -f "${archive}" && "$(cat "${archive}.id" 2>/dev/null)" == "${image_id}" ]]; then
		log "reusing ${archive} (image ${image_id:0:12})"
	else
		log "writing ${archive}"
		rm -f "${archive}.tmp" "${archive}.id"
		buildah push --quiet "${name}" "oci-archive:${archive}.tmp:${name}" >&2
		mv -f "${archive}.tmp" "${archive}"
		printf '%s\n' "${image_id}" >"${archive}.id"
	fi
	log "done: ${name} (image ${image_id:0:12}) in buildah's storage; OCI archive ${archive}"
}

build_image operator "${IMG}" "${IMAGE_ARCHIVE}"
build_image sample "${SAMPLE_IMG}" "${SAMPLE_IMAGE_ARCHIVE}"

log "import them into containerd with: ctr -n k8s.io images import <archive>"
# stdout: the archives' paths, the operator's first, for scripts.
printf '%s\n' "${IMAGE_ARCHIVE}" "${SAMPLE_IMAGE_ARCHIVE}"

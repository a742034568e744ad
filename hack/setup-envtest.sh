#!/usr/bin/env bash
# Make a real kube-apiserver + etcd available for controller-runtime's envtest
# (and, with --with-control-plane, kube-controller-manager + kube-scheduler).
#
# Usage: hack/setup-envtest.sh [--with-control-plane] [--with-node]
#
# --with-node adds the kubelet, kube-proxy and CoreDNS of the local cluster's
# real node and implies --with-control-plane. setup-envtest never ships them;
# they are always built from the Go modules (CoreDNS from this repo's module
# test/localcluster/coredns, at the version its go.mod requires).
#
# Prints exactly one line on stdout: the directory to use as KUBEBUILDER_ASSETS.
# All progress goes to stderr, so this works:
#   export KUBEBUILDER_ASSETS="$(hack/setup-envtest.sh)"
#
# First choice is setup-envtest (downloads release binaries). Where that host is
# unreachable, the binaries are built from the Go module proxy and cached where
# setup-envtest would cache them, so the next run takes seconds.
#
# Environment:
#   ENVTEST_K8S_VERSION    Kubernetes version (default 1.37.2)
#   ETCD_VERSION           etcd version to build in the fallback (default v3.6.16)
#   SETUP_ENVTEST_VERSION  setup-envtest module version (default v0.25.1)
#   LOCALBIN               where setup-envtest is installed (default <repo>/bin)
#   ENVTEST_DIR            binary directory (default
#                          ~/.local/share/kubebuilder-envtest/k8s/<ver>-<os>-<arch>)
set -euo pipefail

log() { printf 'setup-envtest.sh: %s\n' "$*" >&2; }
die() { printf 'setup-envtest.sh: error: %s\n' "$*" >&2; exit 1; }

usage() {
	sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
}

with_control_plane=false
with_node=false
for arg in "$@"; do
	case "$arg" in
	--with-control-plane) with_control_plane=true ;;
	--with-node) with_control_plane=true with_node=true ;;
	-h | --help) usage; exit 0 ;;
	*) die "unknown argument: $arg (usage: hack/setup-envtest.sh [--with-control-plane] [--with-node])" ;;
	esac
done

command -v go >/dev/null 2>&1 || die "go not found: install Go 1.26 (https://go.dev/doc/install) and put it on PATH"
go_version="$(go env GOVERSION 2>/dev/null || true)"
if [[ "$go_version" =~ ^go1\.([0-9]+) ]] && ((BASH_REMATCH[1] < 26)); then
	log "warning: $go_version found; building Kubernetes 1.37 needs Go 1.26 (go switches toolchains only with GOTOOLCHAIN=auto)"
fi

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

K8S_VERSION="${ENVTEST_K8S_VERSION:-1.37.2}"
K8S_VERSION="${K8S_VERSION#v}"
[[ "$K8S_VERSION" =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)$ ]] ||
	die "ENVTEST_K8S_VERSION must look like 1.37.2, got '$K8S_VERSION'"
K8S_MAJOR="${BASH_REMATCH[1]}"
K8S_MINOR="${BASH_REMATCH[2]}"
K8S_PATCH="${BASH_REMATCH[3]}"
STAGING_VERSION="v0.${K8S_MINOR}.${K8S_PATCH}"

etcd_pinned=false
[[ -n "${ETCD_VERSION:-}" ]] && etcd_pinned=true
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
ETCD_VERSION="v${ETCD_VERSION#v}"

SETUP_ENVTEST_VERSION="${SETUP_ENVTEST_VERSION:-v0.25.1}"
LOCALBIN="${LOCALBIN:-$REPO_ROOT/bin}"

GOOS_="$(go env GOOS)"
GOARCH_="$(go env GOARCH)"
ENVTEST_ROOT="${XDG_DATA_HOME:-$HOME/.local/share}/kubebuilder-envtest"
ENVTEST_DIR="${ENVTEST_DIR:-$ENVTEST_ROOT/k8s/${K8S_VERSION}-${GOOS_}-${GOARCH_}}"

k8s_bins=(kube-apiserver)
if $with_control_plane; then
	k8s_bins+=(kube-controller-manager kube-scheduler)
fi
if $with_node; then
	k8s_bins+=(kubelet kube-proxy)
fi
COREDNS_MODULE="$REPO_ROOT/test/localcluster/coredns"
COREDNS_VERSION="$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" { print $3 }' "$COREDNS_MODULE/go.mod")"

# --- cache checks -----------------------------------------------------------

# k8s_ok BIN: BIN exists in ENVTEST_DIR and reports the wanted version.
k8s_ok() {
	local bin="$ENVTEST_DIR/$1" out
	[[ -x "$bin" ]] || return 1
	out="$(timeout 30 "$bin" --version 2>/dev/null)" || return 1
	# "Kubernetes v1.37.2" (and not v1.37.20)
	[[ "$out" =~ (^|[[:space:]])v"${K8S_VERSION}"($|[[:space:]]) ]]
}

# etcd_ok: etcd exists and runs; when ETCD_VERSION was set explicitly it must match
# (an etcd that setup-envtest downloaded is accepted at whatever version it ships).
etcd_ok() {
	local bin="$ENVTEST_DIR/etcd" out
	[[ -x "$bin" ]] || return 1
	out="$(timeout 30 "$bin" --version 2>/dev/null)" || return 1
	[[ "$out" == *"etcd Version:"* ]] || return 1
	if $etcd_pinned; then
		grep -qxF "etcd Version: ${ETCD_VERSION#v}" <<<"$out" || return 1
	fi
}

# coredns_ok: CoreDNS exists and reports the version test/localcluster/coredns requires.
coredns_ok() {
	local bin="$ENVTEST_DIR/coredns" out
	[[ -x "$bin" ]] || return 1
	out="$(timeout 30 "$bin" -version 2>/dev/null | head -1)" || return 1
	[[ "$out" == "CoreDNS-${COREDNS_VERSION#v}" ]]
}

missing_k8s=()
missing_etcd=false
missing_coredns=false
check_cache() {
	missing_k8s=()
	local b
	for b in "${k8s_bins[@]}"; do
		k8s_ok "$b" || missing_k8s+=("$b")
	done
	missing_etcd=false
	etcd_ok || missing_etcd=true
	missing_coredns=false
	if $with_node && ! coredns_ok; then
		missing_coredns=true
	fi
}

finish() {
	log "KUBEBUILDER_ASSETS=$ENVTEST_DIR"
	printf '%s\n' "$ENVTEST_DIR"
	exit 0
}

check_cache
if [[ ${#missing_k8s[@]} -eq 0 ]] && ! $missing_etcd && ! $missing_coredns; then
	log "cached: Kubernetes v$K8S_VERSION binaries in $ENVTEST_DIR"
	finish
fi

# Lock file and staging area live next to ENVTEST_DIR, not inside it: setup-envtest
# treats an existing version directory as installed, and a staging directory on the
# same filesystem makes the final mv an atomic rename.
ENVTEST_PARENT="$(dirname "$ENVTEST_DIR")"
mkdir -p "$ENVTEST_PARENT"

# Serialize concurrent runs (two terminals, make -j) on the same directory.
if command -v flock >/dev/null 2>&1; then
	exec 9>"$ENVTEST_PARENT/.$(basename "$ENVTEST_DIR").lock"
	if ! flock -n 9; then
		log "another run is preparing $ENVTEST_DIR; waiting for it"
		flock 9
	fi
	check_cache
	if [[ ${#missing_k8s[@]} -eq 0 ]] && ! $missing_etcd && ! $missing_coredns; then
		finish
	fi
	# Holding the lock, any staging directory left here is from a killed run.
	for d in "$ENVTEST_PARENT/.staging-$(basename "$ENVTEST_DIR")."*; do
		[[ -d "$d" ]] || continue
		chmod -R u+w "$d" 2>/dev/null || true
		rm -rf "$d"
	done
fi

tmp_dirs=()
cleanup() {
	local d
	for d in "${tmp_dirs[@]}"; do
		[[ -n "$d" && -e "$d" ]] || continue
		chmod -R u+w "$d" 2>/dev/null || true
		rm -rf "$d"
	done
	return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stage="$(mktemp -d "$ENVTEST_PARENT/.staging-$(basename "$ENVTEST_DIR").XXXXXX")"
tmp_dirs+=("$stage")

# install_bin FILE: atomically move FILE from the staging area into ENVTEST_DIR.
install_bin() {
	mkdir -p "$ENVTEST_DIR"
	chmod u+w "$ENVTEST_DIR" # setup-envtest leaves its directories read-only
	chmod 0755 "$stage/$1"
	mv -f "$stage/$1" "$ENVTEST_DIR/$1"
}

# --- first choice: setup-envtest --------------------------------------------

try_setup_envtest() {
	local se="$LOCALBIN/setup-envtest" store="$ENVTEST_ROOT" std_dir dir f
	if ! { [[ -x "$se" ]] && go version -m "$se" 2>/dev/null |
		grep -Eq "^[[:space:]]+mod[[:space:]]+sigs.k8s.io/controller-runtime/tools/setup-envtest[[:space:]]+${SETUP_ENVTEST_VERSION}([[:space:]]|$)"; }; then
		log "installing setup-envtest $SETUP_ENVTEST_VERSION into $LOCALBIN"
		mkdir -p "$LOCALBIN"
		if ! GOBIN="$LOCALBIN" timeout 300 go install \
			"sigs.k8s.io/controller-runtime/tools/setup-envtest@${SETUP_ENVTEST_VERSION}" >&2; then
			log "could not install setup-envtest"
			return 1
		fi
	fi
	# setup-envtest does not download into a version directory that already exists;
	# if the standard one is there but incomplete, let it download into a scratch store.
	std_dir="$ENVTEST_ROOT/k8s/${K8S_VERSION}-${GOOS_}-${GOARCH_}"
	if [[ -e "$std_dir" ]] && ! [[ -x "$std_dir/kube-apiserver" && -x "$std_dir/etcd" ]]; then
		store="$stage/store"
	fi
	log "trying: setup-envtest use $K8S_VERSION --bin-dir $store (60 s limit)"
	dir="$(timeout 60 "$se" use "$K8S_VERSION" --bin-dir "$store" -p path)" || return 1
	[[ -n "$dir" && -x "$dir/kube-apiserver" && -x "$dir/etcd" ]] || return 1
	if [[ "$(cd "$dir" && pwd -P)" != "$(cd "$ENVTEST_DIR" 2>/dev/null && pwd -P)" ]]; then
		log "copying setup-envtest's binaries from $dir to $ENVTEST_DIR"
		for f in kube-apiserver etcd kubectl; do
			[[ -x "$dir/$f" ]] || continue
			cp "$dir/$f" "$stage/$f"
			install_bin "$f"
		done
	fi
	return 0
}

# After setup-envtest: kube-apiserver and etcd must be there now; setup-envtest never
# ships controller-manager/scheduler, so those may still be missing (built below).
setup_envtest_sufficed() {
	check_cache
	$missing_etcd && return 1
	local b
	for b in "${missing_k8s[@]}"; do
		[[ "$b" == kube-apiserver ]] && return 1
	done
	return 0
}

need_download=$missing_etcd
for b in "${missing_k8s[@]}"; do
	[[ "$b" == kube-apiserver ]] && need_download=true
done
if $need_download; then
	if try_setup_envtest && setup_envtest_sufficed; then
		log "setup-envtest provided kube-apiserver and etcd"
	else
		log "setup-envtest did not provide what is needed (download host unreachable?); building from Go modules instead"
		check_cache
	fi
fi

# --- fallback: build from Go modules ----------------------------------------

build_k8s() {
	local bins=("$@") mod gomod staging pkgs=() ldflags date p b m
	mod="$(mktemp -d "${TMPDIR:-/tmp}/envtest-k8s.XXXXXX")"
	tmp_dirs+=("$mod")
	local eta="~2 min"
	[[ " ${bins[*]} " == *" kube-apiserver "* ]] && eta="~4-8 min"
	log "building ${bins[*]} v$K8S_VERSION from k8s.io/kubernetes ($eta on 2 cores)"

	gomod="$(cd "$mod" && go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" |
		sed -n 's/^[[:space:]]*"GoMod":[[:space:]]*"\(.*\)",\{0,1\}$/\1/p')" ||
		die "cannot download k8s.io/kubernetes@v$K8S_VERSION from the Go module proxy"
	[[ -f "$gomod" ]] || die "no go.mod found for k8s.io/kubernetes@v$K8S_VERSION"

	# Every module that kubernetes' go.mod replaces with ./staging/... is published
	# on its own as k8s.io/<name> v0.<minor>.<patch>.
	staging="$(awk '/=>[[:space:]]*\.\/staging\// {
		for (i = 1; i <= NF; i++) if ($i == "=>") {
			m = $(i - 1); if (m ~ /^v[0-9]/) m = $(i - 2); print m; break
		}
	}' "$gomod" | sort -u)"
	[[ -n "$staging" ]] || die "found no ./staging replacements in $gomod"

	(
		cd "$mod"
		go mod init envtest.local/kubernetes >/dev/null 2>&1
		args=("-require=k8s.io/kubernetes@v$K8S_VERSION")
		while read -r m; do
			args+=("-replace=$m=$m@$STAGING_VERSION")
		done <<<"$staging"
		go mod edit "${args[@]}"
	)

	date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
	ldflags="-s -w"
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=$K8S_MAJOR -X $p.gitMinor=$K8S_MINOR"
		ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=$date"
	done
	for b in "${bins[@]}"; do
		pkgs+=("k8s.io/kubernetes/cmd/$b")
	done

	(cd "$mod" && CGO_ENABLED=0 go build -mod=mod -trimpath -ldflags "$ldflags" -o "$stage/" "${pkgs[@]}") ||
		die "building ${bins[*]} failed (see the go output above)"

	for b in "${bins[@]}"; do
		install_bin "$b"
	done
}

build_etcd() {
	local mod
	mod="$(mktemp -d "${TMPDIR:-/tmp}/envtest-etcd.XXXXXX")"
	tmp_dirs+=("$mod")
	log "building etcd $ETCD_VERSION from go.etcd.io/etcd/server/v3 (~1 min)"
	(
		cd "$mod" &&
			go mod init envtest.local/etcd >/dev/null 2>&1 &&
			go mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION" &&
			CGO_ENABLED=0 go build -mod=mod -trimpath -ldflags "-s -w" -o "$stage/etcd" go.etcd.io/etcd/server/v3
	) || die "building etcd $ETCD_VERSION failed (see the go output above)"
	install_bin etcd
}

build_coredns() {
	log "building CoreDNS $COREDNS_VERSION from $COREDNS_MODULE (~2 min on 2 cores)"
	# A module of its own, outside go.work: its graph never meets the product's.
	(cd "$COREDNS_MODULE" && GOWORK=off CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$stage/coredns" .) ||
		die "building CoreDNS failed (see the go output above)"
	install_bin coredns
}

start=$SECONDS
if $missing_etcd; then
	build_etcd
fi
if $missing_coredns; then
	build_coredns
fi
if [[ ${#missing_k8s[@]} -gt 0 ]]; then
	build_k8s "${missing_k8s[@]}"
fi

check_cache
if [[ ${#missing_k8s[@]} -gt 0 ]] || $missing_etcd || $missing_coredns; then
	die "after building, still missing or wrong version in $ENVTEST_DIR: ${missing_k8s[*]} $($missing_etcd && echo etcd) $($missing_coredns && echo coredns)"
fi
log "done in $((SECONDS - start)) s"
finish

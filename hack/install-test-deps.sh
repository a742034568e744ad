#!/usr/bin/env bash
# install-test-deps.sh makes a Debian/Ubuntu machine ready for the tests that need
# real servers (internal/testenv): redis-server and the PostgreSQL server binaries
# (initdb, pg_ctl, postgres). It is a quick no-op when everything is present.
#
# As root it installs what is missing with apt-get; otherwise it prints the command
# to run and exits 1. The tests start their own throwaway servers on free loopback
# ports, so a system redis or PostgreSQL that the packages may start is left alone.
set -euo pipefail

log() { printf 'install-test-deps: %s\n' "$*"; }

# pg_bindir prints the first directory holding initdb, pg_ctl and postgres:
# /usr/lib/postgresql/<version>/bin (newest first), then every directory on PATH.
pg_bindir() {
	local dir
	local -a candidates=()
	if compgen -G '/usr/lib/postgresql/*/bin' >/dev/null; then
		mapfile -t candidates < <(printf '%s\n' /usr/lib/postgresql/*/bin | sort -t/ -k5,5 -rn)
	fi
	local IFS=:
	for dir in "${candidates[@]}" ${PATH}; do
		[[ -n "${dir}" ]] || continue
		if [[ -x "${dir}/initdb" && -x "${dir}/pg_ctl" && -x "${dir}/postgres" ]]; then
			printf '%s\n' "${dir}"
			return 0
		fi
	done
	return 1
}

have_redis() { command -v redis-server >/dev/null 2>&1 || [[ -x /usr/bin/redis-server ]]; }

# --node (make node-deps): also what the local cluster's node needs:
# containerd with ctr and its runc shim, runc, the CNI plugins, iptables.
with_node=false
for arg in "$@"; do
	case "$arg" in
	--node) with_node=true ;;
	*) log "unknown argument: $arg (usage: hack/install-test-deps.sh [--node])"; exit 2 ;;
	esac
done

missing=()
have_redis || missing+=(redis-server)
pg_bindir >/dev/null || missing+=(postgresql)
command -v ip >/dev/null 2>&1 || missing+=(iproute2) # the local cluster's bridge
if $with_node; then
	{ command -v containerd && command -v ctr && command -v containerd-shim-runc-v2; } >/dev/null 2>&1 || missing+=(containerd)
	command -v runc >/dev/null 2>&1 || missing+=(runc)
	command -v iptables >/dev/null 2>&1 || missing+=(iptables)
	[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback && -x /usr/lib/cni/portmap ]] ||
		missing+=(containernetworking-plugins)
fi

if ((${#missing[@]} > 0)); then
	log "missing: ${missing[*]}"
	if [[ "$(id -u)" -ne 0 ]]; then
		log "not running as root; install them with:"
		printf '  sudo apt-get update && sudo apt-get install -y --no-install-recommends %s\n' "${missing[*]}"
		exit 1
	fi
	log "running apt-get update"
	apt-get update
	log "running apt-get install -y --no-install-recommends ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
	have_redis || { log "redis-server still missing after apt-get install"; exit 1; }
	pg_bindir >/dev/null || { log "initdb/pg_ctl/postgres still missing after apt-get install"; exit 1; }
fi

# initdb refuses to run as root, so as root the tests run PostgreSQL as "postgres".
if [[ "$(id -u)" -eq 0 ]] && ! getent passwd postgres >/dev/null; then
	log "creating system user postgres"
	useradd --system --user-group --home-dir /var/lib/postgresql --no-create-home \
		--shell /bin/bash --comment 'PostgreSQL administrator' postgres
fi

log "redis-server: $(command -v redis-server || echo /usr/bin/redis-server)"
log "postgresql:   $(pg_bindir)"
log "ready"

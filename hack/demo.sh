#!/usr/bin/env bash
# make demo: the operator and its sample on the local cluster, on a machine
# without Docker (docs/local-cluster.md).
#
#   1. starts the local cluster (or reuses the running one) with the images of
#      make image-offline: go run ./hack/localcluster up --image ...
#   2. starts PostgreSQL and Redis as host processes for the sample
#   3. installs the operator with helm from charts/outbox-operator
#   4. applies the sample (hack/localcluster/demo: config/samples with the
#      host's PostgreSQL and Redis behind the Services postgres and redis)
#   5. places a few orders, waits (bounded) until the OutboxRelay is Ready with
#      a backlog of 0 counted after them, prints `kubectl get outboxrelays` and
#      the worker's log lines, and the KUBECONFIG to use next
#
# Idempotent: a second run reuses what runs. `make demo-down` removes it all.
# Environment: LOCAL_CLUSTER_DIR (state dir), HELM, KUBECTL, ORDERS (default 3),
# DEMO_WAIT (seconds to wait for the OutboxRelay's final state, default 120),
# IMAGE_ARCHIVE and SAMPLE_IMAGE_ARCHIVE (the OCI archives of make
# image-offline, which the node imports).
set -euo pipefail
cd "$(dirname "$0")/.."

STATE=${LOCAL_CLUSTER_DIR:-/var/lib/outbox-local-cluster}
HELM=${HELM:-bin/helm}
KUBECTL=${KUBECTL:-kubectl}
ORDERS=${ORDERS:-3}
NS=default
RELEASE=outbox-operator
OPERATOR_NS=outbox-system

say() { printf '\n\033[1m==> %s\033[0m\n' "$*" >&2; }

images=("${IMAGE_ARCHIVE:-bin/images/outbox-operator.oci.tar}" "${SAMPLE_IMAGE_ARCHIVE:-bin/images/outbox-operator-sample.oci.tar}")
for archive in "${images[@]}"; do
	[ -f "$archive" ] || { echo "$archive is missing: make image-offline builds the images (make demo runs it)" >&2; exit 1; }
done
hack/install-test-deps.sh --node
say "Starting the local cluster (state: $STATE)"
go run ./hack/localcluster up --state-dir "$STATE" --image "${images[0]}" --image "${images[1]}" >/dev/null
export KUBECONFIG="$STATE/kubeconfig"

say "Starting PostgreSQL and Redis on the host for the sample"
eval "$("$STATE/bin/localcluster" demo-services --state-dir "$STATE")"
echo "PostgreSQL 127.0.0.1:$PG_PORT, Redis 127.0.0.1:$REDIS_PORT; pods reach them at $GATEWAY (the host's side of the pod network)" >&2

# Both namespaces enforce the restricted Pod Security Standard, as a careful
# cluster would: the operator, the relays, the cleanup Jobs and the sample must
# all be admitted under it (the API server's PodSecurity admission refuses any
# pod that is not).
say "Namespaces $OPERATOR_NS and $NS: Pod Security restricted (enforce)"
for ns in "$OPERATOR_NS" "$NS"; do
	"$KUBECTL" create namespace "$ns" --dry-run=client -o yaml | "$KUBECTL" apply -f - >/dev/null
	"$KUBECTL" label namespace "$ns" --overwrite \
		pod-security.kubernetes.io/enforce=restricted pod-security.kubernetes.io/enforce-version=latest \
		pod-security.kubernetes.io/warn=restricted pod-security.kubernetes.io/warn-version=latest >/dev/null
done

say "Installing the operator: helm upgrade --install $RELEASE charts/outbox-operator"
"$HELM" upgrade --install "$RELEASE" charts/outbox-operator \
	--namespace "$OPERATOR_NS" --create-namespace \
	--set image.tag=dev --set logFormat=text --wait --timeout 3m >/dev/null
"$KUBECTL" -n "$OPERATOR_NS" get deploy "$RELEASE"

say "Applying the sample: kubectl apply -k hack/localcluster/demo"
"$KUBECTL" -n "$NS" apply -k hack/localcluster/demo
"$KUBECTL" -n "$NS" apply -f - <<YAML
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: postgres-host
  labels:
    kubernetes.io/service-name: postgres
    endpointslice.kubernetes.io/managed-by: local-cluster-demo
addressType: IPv4
ports: [{name: postgres, port: $PG_PORT, protocol: TCP}]
endpoints: [{addresses: ["$GATEWAY"], conditions: {ready: true}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: redis-host
  labels:
    kubernetes.io/service-name: redis
    endpointslice.kubernetes.io/managed-by: local-cluster-demo
addressType: IPv4
ports: [{name: redis, port: $REDIS_PORT, protocol: TCP}]
endpoints: [{addresses: ["$GATEWAY"], conditions: {ready: true}}]
YAML

say "Waiting for the migration, orders-api, the worker and the relay"
"$KUBECTL" -n "$NS" wait --for=condition=complete job/orders-migrate --timeout=5m
"$KUBECTL" -n "$NS" wait --for=condition=available deploy/orders-api deploy/worker --timeout=5m
for _ in $(seq 1 120); do
	"$KUBECTL" -n "$NS" get deploy orders-relay >/dev/null 2>&1 && break
	sleep 1
done
"$KUBECTL" -n "$NS" wait --for=condition=available deploy/orders-relay --timeout=5m

say "Placing $ORDERS orders: POST /orders to orders-api"
ip=$("$KUBECTL" -n "$NS" get pod -l app.kubernetes.io/name=orders-api --field-selector=status.phase=Running -o jsonpath='{.items[0].status.podIP}')
for i in $(seq 1 "$ORDERS"); do
	curl -fsS -X POST "http://$ip:8080/orders" -H 'content-type: application/json' \
		-d "{\"customer_email\": \"reader$i@example.com\", \"amount\": \"1$i.99\"}"
done

say "The worker's confirmation emails"
want=$ORDERS
for _ in $(seq 1 60); do
	got=$("$KUBECTL" -n "$NS" logs deploy/worker | grep -c 'sending confirmation email' || true)
	[ "$got" -ge "$want" ] && break
	sleep 1
done
"$KUBECTL" -n "$NS" logs deploy/worker | grep 'sending confirmation email' || echo "(none yet: kubectl logs deploy/worker)" >&2

# The state the demo promises: the OutboxRelay Ready, and a backlog of 0
# counted after the orders went out. The backlog is counted every
# spec.backlog.checkInterval (30s in the sample), so this waits for the
# next check, at most DEMO_WAIT seconds.
say "Waiting for the OutboxRelay: Ready, and a backlog of 0 counted after the orders"
relayed=$(date -u +%s)
deadline=$((relayed + ${DEMO_WAIT:-120}))
while :; do
	state=$("$KUBECTL" -n "$NS" get outboxrelay orders \
		-o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.backlog} {.status.lastBacklogCheckTime}' 2>/dev/null || true)
	read -r ready backlog checked <<<"$state" || true
	if [ "${ready:-}" = True ] && [ "${backlog:-}" = 0 ] && [ -n "${checked:-}" ] &&
		[ "$(date -u -d "$checked" +%s)" -ge "$relayed" ]; then
		break
	fi
	if [ "$(date -u +%s)" -ge "$deadline" ]; then
		echo "The OutboxRelay orders is not Ready with a backlog of 0 after ${DEMO_WAIT:-120}s (Ready=${ready:-?}, backlog=${backlog:-?}, checked ${checked:-never}):" >&2
		"$KUBECTL" -n "$NS" describe outboxrelay orders >&2 || true
		exit 1
	fi
	sleep 2
done

say "kubectl get outboxrelays"
"$KUBECTL" -n "$NS" get outboxrelays

say "Done. Use the cluster with:"
echo "export KUBECONFIG=$KUBECONFIG"
echo "KUBECONFIG=$KUBECONFIG"
echo "Stop everything with: make demo-down" >&2

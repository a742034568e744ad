# outbox-operator Makefile, in the shape of a kubebuilder v4 project.
# Every tool is pinned and installed into ./bin.

IMG ?= ghcr.io/outbox-dev/outbox-operator:dev
# IMAGE_REPO is the image name as config/ and the chart know it (without a tag).
IMAGE_REPO ?= ghcr.io/outbox-dev/outbox-operator
# SAMPLE_IMG is the sample application's image (the Dockerfile's target
# sample: orders-api and the worker), as config/samples names it.
SAMPLE_IMG ?= ghcr.io/outbox-dev/outbox-operator-sample:dev
ENVTEST_K8S_VERSION ?= 1.37.2

# CONTAINER_TOOL builds and pushes the image: docker, podman or buildah.
CONTAINER_TOOL ?= docker
# CONTAINER_BUILD_ARGS are more flags of docker-build, e.g. other base images:
# --build-arg BUILDER_IMAGE=... --build-arg RUNTIME_IMAGE=... (see the Dockerfile).
CONTAINER_BUILD_ARGS ?=
# BUILDAH_ISOLATION is buildah's isolation of the Dockerfile's RUN steps (chroot
# needs no OCI runtime set up for nested containers; oci is buildah's default).
BUILDAH_ISOLATION ?= chroot
# PLATFORMS are the targets of docker-buildx.
PLATFORMS ?= linux/amd64,linux/arm64
# KUBECTL talks to the cluster of the current kubeconfig (install, deploy, run).
KUBECTL ?= kubectl
# CHART is the Helm chart; its CRD and manager rules are generated (helm-sync).
CHART ?= charts/outbox-operator
# DIST is where build-installer writes install.yaml (gitignored).
DIST ?= dist

# The Go workspace (go.work): the product module (.), the tools of hack/ and the
# test infrastructure of test/, each a module of its own so that the product's
# go.mod lists only what the product uses (docs/development.md, "Modules").
# test/monitoring and test/localcluster/coredns stay outside the workspace (the
# Prometheus and CoreDNS modules' graphs), built with GOWORK=off.
GO_MODULES := . hack test
GO_PACKAGES := ./... ./hack/... ./test/...

# Setting SHELL to bash allows bash commands to be executed by recipes.
SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec

GOBIN ?= $(shell go env GOBIN)
ifeq (,$(GOBIN))
GOBIN = $(shell go env GOPATH)/bin
endif

##@ General

.PHONY: all
all: build

.PHONY: help
help: ## Display this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Demo

.PHONY: demo-relay
demo-relay: test-deps ## Run the relay on throwaway PostgreSQL and Redis: schema, three events, the stream.
	go run ./hack/demo-relay

# LOCAL_CLUSTER_DIR is the state dir of the local cluster (docs/local-cluster.md).
LOCAL_CLUSTER_DIR ?= /var/lib/outbox-local-cluster

# node-deps installs what the local cluster's node needs (containerd, runc, the
# CNI plugins, iptables) besides test-deps' servers.
.PHONY: node-deps
node-deps: ## Install what the local cluster's node needs when missing: containerd, runc, the CNI plugins, iptables (apt-get, as root).
	hack/install-test-deps.sh --node

.PHONY: demo
demo: node-deps helm image-offline ## Run the operator (helm install) and its sample on the local cluster (no Docker; the images of image-offline), place orders; prints KUBECONFIG=<path>.
	LOCAL_CLUSTER_DIR="$(LOCAL_CLUSTER_DIR)" HELM="$(HELM)" KUBECTL="$(KUBECTL)" \
		IMAGE_ARCHIVE="$(IMAGE_ARCHIVE)" SAMPLE_IMAGE_ARCHIVE="$(SAMPLE_IMAGE_ARCHIVE)" hack/demo.sh

.PHONY: demo-down
demo-down: ## Stop everything make demo started (cluster, pods, PostgreSQL, Redis); remove its rules, mounts, interfaces and files.
	go run ./hack/localcluster down --state-dir "$(LOCAL_CLUSTER_DIR)"

.PHONY: local-cluster-up
local-cluster-up: node-deps image-offline ## Start (or reuse) the local cluster: real control plane, a kubelet on containerd with the images of image-offline; prints KUBECONFIG=<path>.
	go run ./hack/localcluster up --state-dir "$(LOCAL_CLUSTER_DIR)" --image "$(IMAGE_ARCHIVE)" --image "$(SAMPLE_IMAGE_ARCHIVE)"

.PHONY: local-cluster-down
local-cluster-down: ## Stop the local cluster and remove its rules, mounts, interfaces and files.
	go run ./hack/localcluster down --state-dir "$(LOCAL_CLUSTER_DIR)"

.PHONY: test-local-cluster
test-local-cluster: node-deps image-offline ## Run the local cluster's tests, the one that starts a cluster with the images of image-offline included (root).
	IMAGE_ARCHIVE="$(IMAGE_ARCHIVE)" SAMPLE_IMAGE_ARCHIVE="$(SAMPLE_IMAGE_ARCHIVE)" \
		go test -tags localcluster ./test/localcluster/... -count=1 -v -timeout 30m

##@ Development

# controller-gen reads the markers of the product module alone (GOWORK=off) in
# api/ and internal/ (CONTROLLER_GEN_PATHS), where they are: in the workspace
# its loader refuses ./... ("directory prefix . does not contain modules listed
# in go.work"), and with ./... it also loads the nested modules hack/ and test/
# in the product module's context, whose go.sum lacks their requirements.
CONTROLLER_GEN_PATHS := ./api/...;./internal/...
.PHONY: manifests
manifests: controller-gen ## Generate the CRD and RBAC manifests from the Go markers, and the chart's copies of them.
	@if [ -d api ] && ls api/*/*.go >/dev/null 2>&1; then \
		GOWORK=off "$(CONTROLLER_GEN)" rbac:roleName=manager-role crd webhook paths="$(CONTROLLER_GEN_PATHS)" output:crd:artifacts:config=config/crd/bases; \
	fi
	@$(MAKE) --no-print-directory helm-sync

.PHONY: diagrams
diagrams: ## Render docs/*.dot to PNG with Graphviz (apt-get install -y graphviz): the architecture picture of docs/controller.md.
	@command -v dot >/dev/null || { echo "diagrams needs Graphviz's dot: apt-get install -y graphviz" >&2; exit 1; }
	@for f in docs/*.dot; do dot -Tpng -Gdpi=110 "$$f" -o "$${f%.dot}.png"; echo "$${f%.dot}.png"; done

.PHONY: generate
generate: controller-gen ## Generate DeepCopy methods.
	@if [ -d api ] && ls api/*/*.go >/dev/null 2>&1; then \
		GOWORK=off "$(CONTROLLER_GEN)" object:headerFile="hack/boilerplate.go.txt" paths="./api/..."; \
	fi

# fmt runs gofmt on the directories of every module: `go fmt` refuses patterns
# of the workspace's other modules ("directory prefix hack does not contain
# main module"), gofmt reads files.
GO_DIRS := api cmd internal pkg examples hack test

.PHONY: fmt
fmt: ## Run gofmt against code (every module).
	gofmt -l -w $(GO_DIRS)

.PHONY: vet
vet: ## Run go vet against code.
	go vet $(GO_PACKAGES)

# lint covers every module: the workspace's (GO_MODULES) and test/monitoring
# (outside the workspace: GOWORK=off), each from its own directory; all find
# .golangci.yml in the parent directories. test/localcluster/coredns, one
# main.go of imports, is left out: loading CoreDNS's packages for the linters
# took five minutes here; hack/setup-envtest.sh --with-node compiles it.
.PHONY: lint
lint: golangci-lint ## Run golangci-lint (.golangci.yml) on every module.
	for m in $(GO_MODULES); do (cd "$$m" && "$(GOLANGCI_LINT)" run) || exit 1; done
	cd test/monitoring && GOWORK=off "$(GOLANGCI_LINT)" run

.PHONY: lint-fix
lint-fix: golangci-lint ## Run golangci-lint and apply the fixes it can (every module).
	for m in $(GO_MODULES); do (cd "$$m" && "$(GOLANGCI_LINT)" run --fix) || exit 1; done
	cd test/monitoring && GOWORK=off "$(GOLANGCI_LINT)" run --fix

.PHONY: check-modules
check-modules: ## Check that every Go module is tidy and that go.work builds the product with go.mod's versions (hack/check-modules.sh).
	hack/check-modules.sh

.PHONY: lint-config
lint-config: golangci-lint ## Verify that .golangci.yml is a valid golangci-lint configuration.
	"$(GOLANGCI_LINT)" config verify

.PHONY: test-deps
test-deps: ## Install PostgreSQL and Redis when missing (apt-get, as root).
	hack/install-test-deps.sh

.PHONY: envtest
envtest: ## Provide kube-apiserver and etcd for envtest (download, else build from Go modules; cached).
	@ENVTEST_K8S_VERSION=$(ENVTEST_K8S_VERSION) LOCALBIN=$(LOCALBIN) hack/setup-envtest.sh >/dev/null

GO_TEST_FLAGS ?= -race -count=1 -timeout 20m

.PHONY: test
test: manifests generate fmt vet test-deps helm kustomize promtool ## Run every test: unit, integration (real PostgreSQL and Redis), envtest, the alerts (promtool) and the dashboard.
	KUBEBUILDER_ASSETS="$$(ENVTEST_K8S_VERSION=$(ENVTEST_K8S_VERSION) LOCALBIN=$(LOCALBIN) hack/setup-envtest.sh)" \
		go test $(GO_TEST_FLAGS) $$(go list $(GO_PACKAGES) | grep -v /test/e2e) -coverprofile cover.out
	$(MAKE) --no-print-directory test-monitoring

# test/monitoring is a module of its own outside the workspace (the Prometheus
# module stays out of the product's go.mod and out of go.work): GOWORK=off.
.PHONY: test-monitoring
test-monitoring: promtool ## Test the alerts (promtool test rules) and the dashboard's queries (test/monitoring).
	cd test/monitoring && GOWORK=off PROMTOOL="$(PROMTOOL)" go test -count=1 ./...

# FAULTS_SCALE=full runs the fault suite at the sizes of issue #10 (default: the CI slice).
FAULTS_FLAGS ?= -count=1 -v -parallel 2 -timeout 30m

.PHONY: test-faults
test-faults: test-deps ## Run the fault suite (test/faults): the relay binary under kills, SIGSTOP and blackholed links; FAULTS_SCALE=full for full size.
	go test -tags faults ./test/faults/ $(FAULTS_FLAGS)

.PHONY: test-e2e
test-e2e: manifests generate fmt vet test-e2e-local ## Run the end-to-end suite on the local cluster: start it, run test/e2e, tear it down (test-e2e-kind: on kind).

.PHONY: bench
bench: build test-deps ## Run the relay benchmark and print its table (writes docs/benchmarks.md figures to stdout).
	go run ./hack/bench $(BENCH_ARGS)

##@ Build

# CMDS are the binaries make build builds: the operator's (cmd/: manager, relay,
# kubectl-outbox) and the sample application's (examples/orders/cmd/:
# orders-api, worker; docs/sample.md).
CMDS ?= ./cmd/... ./examples/orders/cmd/...

.PHONY: build
build: fmt vet ## Build the operator's binaries (cmd/) and the sample's (examples/orders/cmd/) into bin/.
	go build -o $(LOCALBIN)/ $(CMDS)

# RUN_ARGS are the manager's flags for `make run` (go run ./cmd/manager --help lists them).
RUN_ARGS ?= --leader-elect=false --log-format=text

.PHONY: run
run: manifests generate fmt vet install ## Run the manager here against the cluster of the current kubeconfig (installs the CRD first; no leader election).
	go run ./cmd/manager $(RUN_ARGS)

# VERSION is compiled into the manager (main.version); its default relay image
# falls back to $(IMAGE_REPO):$(VERSION) when no --relay-image or OPERATOR_IMAGE is set.
VERSION ?= dev

# require-container-engine fails the target $(1) when $(CONTAINER_TOOL) is missing or
# cannot build: docker needs a running engine; podman and buildah need none (their
# `info` checks storage and permissions).
define require-container-engine
@tool="$(CONTAINER_TOOL)"; \
if ! command -v "$$tool" >/dev/null 2>&1; then \
	echo "$(1): $$tool is not installed. Set CONTAINER_TOOL=docker, podman or buildah (apt-get install -y buildah runc), or build without an engine or a registry: make image-offline (docs/install.md)." >&2; \
	exit 1; \
fi; \
if ! "$$tool" info >/dev/null 2>&1; then \
	case "$$(basename "$$tool")" in \
	docker) echo "$(1) needs a running Docker engine; this machine has none (docker info failed). Start one, use CONTAINER_TOOL=podman or buildah, or make image-offline; \`make build\` builds the binaries alone." >&2 ;; \
	*) echo "$(1): $$tool info failed: $$tool cannot use its image storage here (run as root, or set up rootless $$tool: /etc/subuid, /etc/subgid). Its error: $$("$$tool" info 2>&1 | tail -n 1)" >&2 ;; \
	esac; \
	exit 1; \
fi
endef

# CONTAINER_BUILD is $(CONTAINER_TOOL)'s build command. buildah 1.28 (Debian 12)
# sets no TARGETOS/TARGETARCH, so they are passed: this machine's platform.
ifeq ($(notdir $(CONTAINER_TOOL)),buildah)
CONTAINER_BUILD = $(CONTAINER_TOOL) bud --isolation $(BUILDAH_ISOLATION) --layers \
	--build-arg TARGETOS=$(shell go env GOOS) --build-arg TARGETARCH=$(shell go env GOARCH)
else
CONTAINER_BUILD = $(CONTAINER_TOOL) build
endif

.PHONY: docker-build
docker-build: ## Build the images IMG (the operator) and SAMPLE_IMG (the sample) for this machine's platform with CONTAINER_TOOL (docker, podman or buildah).
	$(call require-container-engine,$@)
	$(CONTAINER_BUILD) --build-arg VERSION=$(VERSION) $(CONTAINER_BUILD_ARGS) -t $(IMG) .
	$(CONTAINER_BUILD) --build-arg VERSION=$(VERSION) $(CONTAINER_BUILD_ARGS) --target sample -t $(SAMPLE_IMG) .

.PHONY: docker-push
docker-push: ## Push the images IMG and SAMPLE_IMG.
	$(call require-container-engine,$@)
	$(CONTAINER_TOOL) push $(IMG)
	$(CONTAINER_TOOL) push $(SAMPLE_IMG)

.PHONY: docker-buildx
docker-buildx: ## Build and push IMG and SAMPLE_IMG for every platform of PLATFORMS (needs Docker with buildx).
	@[ "$(notdir $(CONTAINER_TOOL))" = docker ] || { echo "$@ needs Docker with buildx (CONTAINER_TOOL=$(CONTAINER_TOOL)); with podman or buildah, build each platform with --platform into a --manifest list." >&2; exit 1; }
	$(call require-container-engine,$@)
	- $(CONTAINER_TOOL) buildx create --name outbox-operator-builder
	$(CONTAINER_TOOL) buildx use outbox-operator-builder
	- $(CONTAINER_TOOL) buildx build --push --platform=$(PLATFORMS) --build-arg VERSION=$(VERSION) $(CONTAINER_BUILD_ARGS) --tag $(IMG) .
	- $(CONTAINER_TOOL) buildx build --push --platform=$(PLATFORMS) --build-arg VERSION=$(VERSION) $(CONTAINER_BUILD_ARGS) --target sample --tag $(SAMPLE_IMG) .
	- $(CONTAINER_TOOL) buildx rm outbox-operator-builder

# IMAGE_ARCHIVE and SAMPLE_IMAGE_ARCHIVE are the OCI archives of IMG and
# SAMPLE_IMG that image-offline writes (for ctr images import).
IMAGE_ARCHIVE ?= $(LOCALBIN)/images/outbox-operator.oci.tar
SAMPLE_IMAGE_ARCHIVE ?= $(LOCALBIN)/images/outbox-operator-sample.oci.tar

.PHONY: image-offline
image-offline: ## Build IMG and SAMPLE_IMG from the Dockerfile with buildah and locally made base images (root; no engine, no registry); also writes their OCI archives.
	IMG="$(IMG)" SAMPLE_IMG="$(SAMPLE_IMG)" VERSION="$(VERSION)" IMAGE_ARCHIVE="$(IMAGE_ARCHIVE)" SAMPLE_IMAGE_ARCHIVE="$(SAMPLE_IMAGE_ARCHIVE)" \
		hack/images/build-offline.sh >/dev/null

.PHONY: test-image
test-image: image-offline ## Run the images of image-offline with runc (test/image, root): user 65532, read-only root, every binary starts.
	IMG="$(IMG)" IMAGE_ARCHIVE="$(IMAGE_ARCHIVE)" SAMPLE_IMG="$(SAMPLE_IMG)" SAMPLE_IMAGE_ARCHIVE="$(SAMPLE_IMAGE_ARCHIVE)" \
		go test -tags image ./test/image/... -count=1 -v -timeout 10m

# INSTALL_SCOPE picks the kustomization that build-installer, print-installer,
# deploy and undeploy render: namespaced (the default, config/default: the
# manager watches and may act in the namespaces of
# config/default/watch_namespaces.yaml only) or cluster (config/cluster-wide:
# every namespace, a ClusterRoleBinding). docs/install.md explains the choice.
# INSTALLER_DIR=<dir> renders a kustomization of your own instead.
INSTALL_SCOPE ?= namespaced
ifeq ($(INSTALL_SCOPE),namespaced)
INSTALLER_DIR := config/default
else ifeq ($(INSTALL_SCOPE),cluster)
INSTALLER_DIR := config/cluster-wide
endif

.PHONY: install-scope
install-scope:
	@[ -n "$(INSTALLER_DIR)" ] || { echo "INSTALL_SCOPE=$(INSTALL_SCOPE): must be namespaced (config/default, the default) or cluster (config/cluster-wide)" >&2; exit 2; }

# render-installer prints $(INSTALLER_DIR) with the manager's image (and so its
# OPERATOR_IMAGE, the default relay image) set to $(IMG). It builds a throwaway
# overlay in $(DIST)/.kustomize, so, unlike `kustomize edit set image`, it never
# edits a file under config/.
define render-installer
mkdir -p "$(DIST)/.kustomize" && ( \
	cd "$(DIST)/.kustomize" && rm -f kustomization.yaml && \
	installer="$$(realpath --relative-to=. "$(CURDIR)/$(INSTALLER_DIR)")" && \
	base="$$(realpath --relative-to=. "$(CURDIR)/config/base")" && \
	printf '%s\n' "# Generated by make: $(INSTALLER_DIR) with the image $(IMG). Do not edit." \
		"apiVersion: kustomize.config.k8s.io/v1beta1" "kind: Kustomization" \
		"resources:" "- $$installer" "replacements:" "- path: $$base/operator_image_replacement.yaml" > kustomization.yaml && \
	"$(KUSTOMIZE)" edit set image "$(IMAGE_REPO)=$(IMG)" && \
	"$(KUSTOMIZE)" build --load-restrictor LoadRestrictionsNone . )
endef

.PHONY: print-installer
print-installer: install-scope kustomize ## Print what build-installer writes, without regenerating (e.g. make -s print-installer | kubectl diff -f -).
	@$(render-installer)

.PHONY: build-installer
build-installer: install-scope manifests generate kustomize ## Write dist/install.yaml: the CRD, RBAC and the manager (image IMG) in one file; namespaced unless INSTALL_SCOPE=cluster.
	@mkdir -p "$(DIST)"
	@$(render-installer) > "$(DIST)/install.yaml"
	@echo "Wrote $(DIST)/install.yaml ($(INSTALLER_DIR), image $(IMG)). Install with: kubectl apply --server-side -f $(DIST)/install.yaml"

##@ Deployment

ifndef ignore-not-found
  ignore-not-found = false
endif

.PHONY: install
install: manifests kustomize ## Install the CRD into the cluster of the current kubeconfig.
	"$(KUSTOMIZE)" build config/crd | $(KUBECTL) apply --server-side --force-conflicts -f -

.PHONY: uninstall
uninstall: manifests kustomize ## Remove the CRD (and so every OutboxRelay) from the cluster. ignore-not-found=true ignores missing objects.
	"$(KUSTOMIZE)" build config/crd | $(KUBECTL) delete --ignore-not-found=$(ignore-not-found) -f -

.PHONY: deploy
deploy: install-scope manifests kustomize ## Deploy the operator (image IMG) to the cluster of the current kubeconfig; namespaced unless INSTALL_SCOPE=cluster.
	@$(render-installer) | $(KUBECTL) apply --server-side --force-conflicts -f -

.PHONY: undeploy
undeploy: install-scope kustomize ## Remove the operator (CRD included) from the cluster; the INSTALL_SCOPE it was deployed with. ignore-not-found=true ignores missing objects.
	@$(render-installer) | $(KUBECTL) delete --ignore-not-found=$(ignore-not-found) -f -

##@ Helm

.PHONY: helm-sync
helm-sync: ## Copy the generated CRD and manager rules, the alerts and the dashboard into the chart (run by manifests).
	@[ "$$(grep -c '^kind:' config/rbac/role.yaml)" = 1 ] && grep -q '^kind: ClusterRole$$' config/rbac/role.yaml || { \
		echo "helm-sync: config/rbac/role.yaml must hold exactly one ClusterRole; teach $(CHART)/templates/rbac.yaml about the rest." >&2; exit 1; }
	@mkdir -p "$(CHART)/files" "$(CHART)/templates/crds"
	@{ echo "# Generated from config/rbac/role.yaml by 'make helm-sync' (run by 'make manifests'). DO NOT EDIT."; \
		sed -n '/^rules:/,$$p' config/rbac/role.yaml; } > "$(CHART)/files/manager-rules.yaml"
	@rm -f "$(CHART)"/templates/crds/*.yaml
	@for f in config/crd/bases/*.yaml; do \
		awk -v src="$$f" -f charts/crd-to-template.awk "$$f" > "$(CHART)/templates/crds/$$(basename "$$f")"; \
	done
	@{ echo "# Generated from config/prometheus/alerts.yaml by 'make helm-sync' (run by 'make manifests'). DO NOT EDIT."; \
		sed -n '/^groups:/,$$p' config/prometheus/alerts.yaml; } > "$(CHART)/files/alerts.yaml"
	@{ echo "# Generated from alerts.yaml by 'make helm-sync' (run by 'make manifests'). DO NOT EDIT."; \
		echo "# The alerts as a Prometheus Operator PrometheusRule (config/prometheus/kustomization.yaml)."; \
		printf 'apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: alerts\n  namespace: system\n'; \
		printf '  labels:\n    app.kubernetes.io/name: outbox-operator\n    app.kubernetes.io/managed-by: kustomize\nspec:\n'; \
		sed -n '/^groups:/,$$p' config/prometheus/alerts.yaml | sed 's/^\(.\)/  \1/'; } > config/prometheus/prometheus_rule.yaml
	@cp config/grafana/outbox-operator.json "$(CHART)/files/dashboard.json"

.PHONY: helm-lint
helm-lint: helm-sync helm ## Lint the chart with its default values and with each ci/*-values.yaml of the chart.
	"$(HELM)" lint --strict "$(CHART)"
	@for f in "$(CHART)"/ci/*-values.yaml; do \
		echo "==> helm lint --strict -f $$f"; \
		"$(HELM)" lint --strict "$(CHART)" -f "$$f"; \
	done

.PHONY: helm-package
helm-package: helm-sync helm ## Package the chart into dist/.
	"$(HELM)" package "$(CHART)" --destination "$(DIST)"

##@ Dependencies

LOCALBIN ?= $(shell pwd)/bin
$(LOCALBIN):
	mkdir -p $(LOCALBIN)

CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen
KUSTOMIZE ?= $(LOCALBIN)/kustomize
HELM ?= $(LOCALBIN)/helm
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint
PROMTOOL ?= $(LOCALBIN)/promtool

## Tool versions. kustomize v5.8.2 is the newest whose go.mod accepts Go 1.26.
CONTROLLER_TOOLS_VERSION ?= v0.23.0
KUSTOMIZE_VERSION ?= v5.8.2
HELM_VERSION ?= v3.22.0
GOLANGCI_LINT_VERSION ?= v2.15.0
# PROMETHEUS_VERSION is the Go module version of Prometheus whose promtool tests
# the alerting rules (Prometheus v3.16.0 is module version v0.316.0).
PROMETHEUS_VERSION ?= v0.316.0

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN) ## Download controller-gen locally if necessary.
$(CONTROLLER_GEN): $(LOCALBIN)
	$(call go-install-tool,$(CONTROLLER_GEN),sigs.k8s.io/controller-tools/cmd/controller-gen,$(CONTROLLER_TOOLS_VERSION))

.PHONY: kustomize
kustomize: $(KUSTOMIZE) ## Download kustomize locally if necessary.
$(KUSTOMIZE): $(LOCALBIN)
	$(call go-install-tool,$(KUSTOMIZE),sigs.k8s.io/kustomize/kustomize/v5,$(KUSTOMIZE_VERSION))

# HELM_K8S_MINOR is the Kubernetes minor of helm's client libraries (k8s.io/client-go
# v0.37 for helm v3.22). Helm's release build sets it, and its version, with ldflags;
# without them `helm template` and `helm lint` take the cluster for Kubernetes 1.20.
HELM_K8S_MINOR ?= 37
HELM_LDFLAGS = -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	$(foreach p,pkg/chartutil pkg/lint/rules,-X helm.sh/helm/v3/$(p).k8sVersionMajor=1 -X helm.sh/helm/v3/$(p).k8sVersionMinor=$(HELM_K8S_MINOR))

.PHONY: helm
helm: $(HELM) ## Build helm locally if necessary (a few minutes the first time).
$(HELM): export GOFLAGS = "-ldflags=$(strip $(HELM_LDFLAGS))"
$(HELM): $(LOCALBIN)
	$(call go-install-tool,$(HELM),helm.sh/helm/v3/cmd/helm,$(HELM_VERSION))

.PHONY: promtool
promtool: $(PROMTOOL) ## Build promtool locally if necessary (a few minutes the first time): `promtool test rules` of the alerts.
$(PROMTOOL): $(LOCALBIN)
	$(call go-install-tool,$(PROMTOOL),github.com/prometheus/prometheus/cmd/promtool,$(PROMETHEUS_VERSION))

.PHONY: golangci-lint
golangci-lint: $(GOLANGCI_LINT) ## Download golangci-lint locally if necessary.
$(GOLANGCI_LINT): $(LOCALBIN)
	$(call go-install-tool,$(GOLANGCI_LINT),github.com/golangci/golangci-lint/v2/cmd/golangci-lint,$(GOLANGCI_LINT_VERSION))

# go-install-tool will 'go install' any package with custom target and name of binary, if it doesn't exist
# $1 - target path with name of binary
# $2 - package url which can be installed
# $3 - specific version of package
define go-install-tool
@[ -f "$(1)-$(3)" ] && [ "$$(readlink -- "$(1)" 2>/dev/null)" = "$(1)-$(3)" ] || { \
set -e; \
package=$(2)@$(3) ;\
echo "Downloading $${package}" ;\
rm -f "$(1)" ;\
GOBIN="$(LOCALBIN)" go install $${package} ;\
mv "$(LOCALBIN)/$$(basename "$(1)")" "$(1)-$(3)" ;\
} ;\
ln -sf "$$(realpath "$(1)-$(3)")" "$(1)"
endef

##@ End-to-end

# E2E_FLAGS are the go test flags of the end-to-end suite (test/e2e, docs/e2e.md).
E2E_FLAGS ?= -v -count=1 -timeout 40m -args -ginkgo.v
KIND ?= $(LOCALBIN)/kind
KIND_VERSION ?= v0.33.0
# KIND_CLUSTER is the kind cluster test-e2e-kind creates and deletes.
KIND_CLUSTER ?= outbox-e2e
# KIND_IMG and KIND_SAMPLE_IMG are the images test-e2e-kind builds and loads;
# config/samples runs their :dev tags.
KIND_IMG ?= $(IMAGE_REPO):dev
KIND_SAMPLE_IMG ?= $(SAMPLE_IMG)

.PHONY: test-e2e-local
test-e2e-local: node-deps helm image-offline ## Run the end-to-end suite on the local cluster (root, no Docker; the images of image-offline): starts it, runs test/e2e, tears it down (E2E_KEEP=1 keeps it).
	E2E_CLUSTER=local LOCAL_CLUSTER_DIR="$(LOCAL_CLUSTER_DIR)" HELM="$(HELM)" \
		IMAGE_ARCHIVE="$(IMAGE_ARCHIVE)" SAMPLE_IMAGE_ARCHIVE="$(SAMPLE_IMAGE_ARCHIVE)" go test -tags=e2e ./test/e2e/... $(E2E_FLAGS)

.PHONY: test-e2e-kind
test-e2e-kind: helm kind ## Run the end-to-end suite on kind (needs Docker): create the cluster, build and load the image, run test/e2e, delete the cluster.
	$(call require-container-engine,$@)
	@mkdir -p "$(DIST)"
	@trap '"$(KIND)" delete cluster --name "$(KIND_CLUSTER)"' EXIT; \
	"$(KIND)" create cluster --name "$(KIND_CLUSTER)" --kubeconfig "$(abspath $(DIST))/kind-$(KIND_CLUSTER).kubeconfig" --wait 5m && \
	$(MAKE) --no-print-directory docker-build IMG="$(KIND_IMG)" SAMPLE_IMG="$(KIND_SAMPLE_IMG)" && \
	"$(KIND)" load docker-image "$(KIND_IMG)" "$(KIND_SAMPLE_IMG)" --name "$(KIND_CLUSTER)" && \
	KUBECONFIG="$(abspath $(DIST))/kind-$(KIND_CLUSTER).kubeconfig" E2E_CLUSTER=kind E2E_IMAGE_TAG="$(lastword $(subst :, ,$(KIND_IMG)))" HELM="$(HELM)" \
		go test -tags=e2e ./test/e2e/... $(E2E_FLAGS)

.PHONY: kind
kind: $(KIND) ## Download kind locally if necessary.
$(KIND): $(LOCALBIN)
	$(call go-install-tool,$(KIND),sigs.k8s.io/kind,$(KIND_VERSION))

# outbox-operator Makefile, in the shape of a kubebuilder v4 project.
# Every tool is pinned and installed into ./bin.

IMG ?= ghcr.io/outbox-dev/outbox-operator:dev
ENVTEST_K8S_VERSION ?= 1.37.2

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

##@ Development

.PHONY: manifests
manifests: controller-gen ## Generate the CRD and RBAC manifests from the Go markers.
	@if [ -d api ] && ls api/*/*.go >/dev/null 2>&1; then \
		"$(CONTROLLER_GEN)" rbac:roleName=manager-role crd webhook paths="./..." output:crd:artifacts:config=config/crd/bases; \
	fi

.PHONY: generate
generate: controller-gen ## Generate DeepCopy methods.
	@if [ -d api ] && ls api/*/*.go >/dev/null 2>&1; then \
		"$(CONTROLLER_GEN)" object:headerFile="hack/boilerplate.go.txt" paths="./api/..."; \
	fi

.PHONY: fmt
fmt: ## Run go fmt against code.
	go fmt ./...

.PHONY: vet
vet: ## Run go vet against code.
	go vet ./...

.PHONY: test-deps
test-deps: ## Install PostgreSQL and Redis when missing (apt-get, as root).
	hack/install-test-deps.sh

.PHONY: envtest
envtest: ## Provide kube-apiserver and etcd for envtest (download, else build from Go modules; cached).
	@ENVTEST_K8S_VERSION=$(ENVTEST_K8S_VERSION) LOCALBIN=$(LOCALBIN) hack/setup-envtest.sh >/dev/null

GO_TEST_FLAGS ?= -race -count=1 -timeout 20m

.PHONY: test
test: manifests generate fmt vet test-deps ## Run every test: unit, integration (real PostgreSQL and Redis) and envtest.
	KUBEBUILDER_ASSETS="$$(ENVTEST_K8S_VERSION=$(ENVTEST_K8S_VERSION) LOCALBIN=$(LOCALBIN) hack/setup-envtest.sh)" \
		go test $(GO_TEST_FLAGS) $$(go list ./... | grep -v /test/e2e) -coverprofile cover.out

.PHONY: bench
bench: build test-deps ## Run the relay benchmark and print its table (writes docs/benchmarks.md figures to stdout).
	go run ./hack/bench $(BENCH_ARGS)

##@ Build

.PHONY: build
build: fmt vet ## Build every binary of cmd/ into bin/.
	go build -o $(LOCALBIN)/ ./cmd/...

##@ Dependencies

LOCALBIN ?= $(shell pwd)/bin
$(LOCALBIN):
	mkdir -p $(LOCALBIN)

CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen
CONTROLLER_TOOLS_VERSION ?= v0.23.0

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN) ## Download controller-gen locally if necessary.
$(CONTROLLER_GEN): $(LOCALBIN)
	$(call go-install-tool,$(CONTROLLER_GEN),sigs.k8s.io/controller-tools/cmd/controller-gen,$(CONTROLLER_TOOLS_VERSION))

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

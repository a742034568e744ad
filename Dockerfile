# syntax=docker/dockerfile:1
#
# Two images, each from a build stage of its own:
#
# - the operator's (the last stage, the default target): the manager, its
#   entrypoint, and the relay (/relay), which the operator runs its relays
#   from unless told otherwise; built from cmd/ (stage builder);
# - the sample application's (--target sample): orders-api, its entrypoint,
#   and the worker (/worker), as config/samples runs them (docs/sample.md);
#   built from examples/orders/cmd/ (stage sample-builder, which adds
#   examples/ to the builder's sources), so that the sample never changes
#   the operator's build.
#
#   make docker-build IMG=... SAMPLE_IMG=...        # this machine's platform
#   make docker-buildx IMG=... PLATFORMS=linux/amd64,linux/arm64
#
# The builder runs on the build machine's platform and cross-compiles for the
# target (pure Go, CGO_ENABLED=0), so a multi-arch build needs no emulation.
#
# The two base images are build arguments, so that a machine without a registry
# can substitute equivalents made locally (make image-offline,
# hack/images/build-offline.sh); the build steps stay the same.

# GO_VERSION is go.mod's Go (the golang image runs with GOTOOLCHAIN=local).
ARG GO_VERSION=1.26.8
# BUILDER_IMAGE compiles the binaries: Go, a shell, CA certificates for the
# module proxy.
ARG BUILDER_IMAGE=golang:${GO_VERSION}
# RUNTIME_IMAGE holds them: CA certificates, tzdata, /etc/passwd with the
# non-root user 65532.
ARG RUNTIME_IMAGE=gcr.io/distroless/static:nonroot

FROM --platform=$BUILDPLATFORM ${BUILDER_IMAGE} AS builder
ARG TARGETOS
ARG TARGETARCH
# VERSION is compiled into the manager; its last-resort default relay image is
# ghcr.io/outbox-dev/outbox-operator:$VERSION.
ARG VERSION=dev

WORKDIR /workspace
# Modules first, so the layer is cached while only the source changes.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download

# Every directory the operator's binaries are built from (.dockerignore keeps
# the rest out of the context; test/packaging checks that this list is
# complete).
COPY api/ api/
COPY cmd/ cmd/
COPY internal/ internal/
COPY pkg/ pkg/

RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags="-s -w -X main.version=${VERSION}" -o /out/ \
    ./cmd/manager ./cmd/relay

# The sample application: its package and binaries (examples/orders), on the
# operator's internal/ and pkg/ packages above.
FROM builder AS sample-builder
# A stage's ARGs end with it: this one declares them again.
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
COPY examples/ examples/

RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags="-s -w -X main.version=${VERSION}" -o /out/ \
    ./examples/orders/cmd/orders-api ./examples/orders/cmd/worker

# distroless static: no shell, no package manager, CA certificates and tzdata
# included; runs as the non-root user 65532.
FROM ${RUNTIME_IMAGE} AS sample
LABEL org.opencontainers.image.source="https://github.com/outbox-dev/outbox-operator" \
      org.opencontainers.image.description="The sample application of outbox-operator: an orders API and an idempotent worker" \
      org.opencontainers.image.licenses="Apache-2.0"
WORKDIR /
COPY --from=sample-builder /out/orders-api /out/worker /
USER 65532:65532

ENTRYPOINT ["/orders-api"]

FROM ${RUNTIME_IMAGE} AS operator
LABEL org.opencontainers.image.source="https://github.com/outbox-dev/outbox-operator" \
      org.opencontainers.image.description="outbox-operator: transactional-outbox relays from PostgreSQL to Redis streams" \
      org.opencontainers.image.licenses="Apache-2.0"
WORKDIR /
COPY --from=builder /out/manager /out/relay /
USER 65532:65532

ENTRYPOINT ["/manager"]

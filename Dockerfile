# One image holds every binary of cmd/: the manager is the entrypoint, and the
# relay, orders-api and worker are invoked by path (/relay, /orders-api, /worker).
FROM golang:1.26 AS builder
ARG TARGETOS
ARG TARGETARCH

WORKDIR /workspace
COPY go.mod go.sum ./
RUN go mod download

COPY api/ api/
COPY cmd/ cmd/
COPY internal/ internal/
COPY pkg/ pkg/

RUN mkdir -p /out && for c in cmd/*/; do \
      CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
        go build -trimpath -ldflags="-s -w" -o /out/ "./$c"; \
    done

FROM gcr.io/distroless/static:nonroot
WORKDIR /
COPY --from=builder /out/ /
USER 65532:65532

ENTRYPOINT ["/manager"]

# syntax=docker/dockerfile:1
# The manager image. The builder runs on the build machine's platform and
# cross-compiles for the target (buildx sets TARGETOS/TARGETARCH), so
# `make docker-buildx` needs no emulation for the Go build.
FROM --platform=$BUILDPLATFORM golang:1.26 AS builder
ARG TARGETOS
ARG TARGETARCH

WORKDIR /workspace
# Dependencies first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download

# The sources (.dockerignore leaves out tests, tools and docs).
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags="-s -w" -o /manager ./cmd

# Static, non-root, no shell: the manager only talks to the API server and the
# metrics backend.
FROM gcr.io/distroless/static:nonroot
WORKDIR /
COPY --from=builder /manager /manager
USER 65532:65532
ENTRYPOINT ["/manager"]

# One image for all three gpupack services: `gpupack webhook serve`, `gpupack extender serve`,
# `gpupack agent run` (the Helm chart passes those as args; the entrypoint is `gpupack`).
#
#   docker build -t gpupack:0.1.0 .
#   docker build --build-arg BASE_IMAGE=localhost/gpupack-base:bookworm -t gpupack:0.1.0 .
#
# BASE_IMAGE must provide python3 (3.11, with the venv module) on PATH; the default is the official
# Python slim image, pinned by version. deploy/image/build.sh builds an equivalent base from Debian packages
# where no registry is reachable.
ARG BASE_IMAGE=docker.io/library/python:3.11.13-slim-bookworm
# The Go toolchain image for gpupack-runc (the RuntimeClass handler: a static binary, standard library
# only). deploy/image/build.sh passes the base image instead and mounts the host's Go at /usr/local/go.
ARG GO_IMAGE=docker.io/library/golang:1.26-bookworm

# ---- handler: gpupack-runc, installed on each node by the agent DaemonSet (docs/node-side.md) ----
FROM ${GO_IMAGE} AS handler
COPY handler /src/handler
RUN cd /src/handler \
 && HOME=/tmp GOCACHE=/tmp/go-cache CGO_ENABLED=0 GOFLAGS=-trimpath GOTOOLCHAIN=local \
    /usr/local/go/bin/go build -ldflags "-s -w -X main.Version=$(cat VERSION)" -o /out/gpupack-runc . \
 && /out/gpupack-runc --gpupack-version

# ---- build: a virtualenv with gpupack and its dependencies, from the source tree ----
FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
# Extra pip flags, empty by default (PyPI). deploy/image/build.sh installs from a local wheel directory
# instead ("--no-index --find-links=/wheels", mounted for the build), so the build needs no network.
ARG PIP_ARGS=""
RUN python3 -m venv /opt/gpupack
# Dependencies first (from pyproject.toml only), so a source change does not re-download them.
COPY pyproject.toml /src/
RUN python3 -c 'import tomllib; print("\n".join(tomllib.load(open("/src/pyproject.toml", "rb"))["project"]["dependencies"]))' \
    > /tmp/requirements.txt
RUN /opt/gpupack/bin/pip install ${PIP_ARGS} -r /tmp/requirements.txt
COPY README.md /src/
COPY LICENSE /src/
COPY app /src/app
COPY webhook /src/webhook
COPY extender /src/extender
COPY agent /src/agent
# A regular (not editable) install: the venv is self-contained and /src stays behind in this stage.
# Nothing installs at run time, so pip and setuptools (a fifth of the venv) stay behind too.
RUN /opt/gpupack/bin/pip install ${PIP_ARGS} --no-deps /src \
 && /opt/gpupack/bin/pip uninstall --yes --quiet pip setuptools \
 && /opt/gpupack/bin/python -m compileall -q /opt/gpupack \
 && /opt/gpupack/bin/gpupack --help > /dev/null

# ---- runtime: the base plus the virtualenv, nothing else ----
FROM ${BASE_IMAGE}
# = pyproject's version and the chart's appVersion (the chart's default image tag).
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="gpupack" \
      org.opencontainers.image.description="Fractional-GPU scheduling for Kubernetes: admission webhook, scheduler extender, NVML node agent" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/gpupack /opt/gpupack
COPY --from=handler /out/gpupack-runc /opt/gpupack/node/gpupack-runc
ENV PATH=/opt/gpupack/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# The chart's podSecurityContext runs as 65532:65532 (the agent overrides it with root for MPS and NVML).
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["gpupack"]
CMD ["--help"]

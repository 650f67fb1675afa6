#!/usr/bin/env bash
# Build the gpupack image (the repo's Dockerfile) where no container registry is reachable:
#   1. base: Debian bookworm (minbase) + python3, python3-venv, ca-certificates, made by mmdebstrap from
#      Debian packages and committed as localhost/gpupack-base:<key> - the equivalent of the official
#      python slim image the Dockerfile defaults to (Debian's Python 3.11 instead of python.org's);
#   2. wheels: gpupack's dependencies (and setuptools for the build), downloaded by the host's pip;
#   3. image: `buildah bud` of the Dockerfile on that base, pip installing from the wheels only, and
#      gpupack-runc (handler/) built by the host's Go toolchain, mounted into the build at /usr/local/go.
# Base and wheels are cached by content (package list, pyproject dependencies) under
# ~/.cache/gpupack/image/, with buildah's own storage there too (vfs driver, chroot isolation: no
# overlayfs, no user namespaces, no daemon). mmdebstrap and buildah come from Debian packages and are
# installed on first use (root: apt-get; otherwise it says what to install).
#
# Usage: deploy/image/build.sh [--archive PATH] [--standins]
#   --archive PATH  also write the image as a docker-archive tarball (what `ctr images import` reads).
#   --standins      TESTS ONLY: add a layer with the stand-ins for NVIDIA binaries that machines without a
#                   GPU lack (tests/standin/mps_control.py as /opt/gpupack-standin/nvidia-cuda-mps-control).
#                   The real-node test tier uses it; never ship such an image.
# Prints the image reference (localhost/gpupack:<version>) as the last line of stdout; progress on stderr.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
archive=""
standins=0
while [ $# -gt 0 ]; do
  case $1 in
    --archive) archive=${2:?--archive needs a path}; shift 2 ;;
    --standins) standins=1; shift ;;
    *) echo "unknown argument: $1 (usage: $0 [--archive PATH] [--standins])" >&2; exit 2 ;;
  esac
done

SUITE=bookworm
PACKAGES=python3,python3-venv,ca-certificates
MIRRORS=(
  "deb http://deb.debian.org/debian $SUITE main"
  "deb http://deb.debian.org/debian $SUITE-updates main"
  "deb http://deb.debian.org/debian-security $SUITE-security main"
)
PYTHON=${PYTHON:-python3}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/gpupack/image
mkdir -p "$cache"
# One build at a time per cache (two would write the same base tarball and wheel directory).
exec 9>"$cache/.lock"
flock 9
step=0; total=4
progress() { step=$((step + 1)); echo "[image $step/$total] $*" >&2; }
since() { echo "$(( $(date +%s) - $1 ))s"; }

# ---- tools ----
missing=()
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v buildah >/dev/null || missing+=(buildah)
if [ ${#missing[@]} -gt 0 ]; then
  progress "apt-get install ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "needs Debian packages: ${missing[*]} (run as root, or install them first)" >&2; exit 2
  fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >&2
else
  progress "tools: mmdebstrap $(mmdebstrap --version | awk '{print $2}'), $(buildah --version | awk '{print $1, $3}')"
fi
B=(buildah --root "$cache/storage" --runroot "$cache/run" --storage-driver vfs)

# ---- base image from Debian packages ----
base_key=$(printf '%s\n' "$SUITE" "$PACKAGES" "${MIRRORS[@]}" minbase-nodoc-v1 | sha256sum | cut -c1-16)
base=localhost/gpupack-base:$base_key
if "${B[@]}" inspect --type image "$base" >/dev/null 2>&1; then
  progress "base $base: cached"
else
  progress "base $base: mmdebstrap $SUITE + $PACKAGES (first time only, about a minute)"
  t0=$(date +%s)
  tar=$cache/base-$base_key.tmp.tar
  mmdebstrap --quiet --variant=minbase --mode=root --include="$PACKAGES" \
    --aptopt='Acquire::Languages "none"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    "$SUITE" "$tar" "${MIRRORS[@]}" >&2
  ctr=$("${B[@]}" from scratch)
  "${B[@]}" add "$ctr" "$tar" / >&2
  "${B[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd /bin/bash \
    --label org.opencontainers.image.description="Debian $SUITE + $PACKAGES (mmdebstrap)" "$ctr"
  "${B[@]}" commit --quiet --rm "$ctr" "$base" >&2
  rm -f "$tar"
  echo "    base built in $(since "$t0")" >&2
fi

# ---- wheels for the dependencies ----
deps=$("$PYTHON" -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
  "$repo/pyproject.toml")
build_req=$("$PYTHON" -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]))' \
  "$repo/pyproject.toml")
wheel_key=$(printf '%s\n' "$deps" "$build_req" "$("$PYTHON" -c 'import sys; print(sys.version_info[:2])')" | sha256sum | cut -c1-16)
wheels=$cache/wheels-$wheel_key
if [ -f "$wheels/.complete" ]; then
  progress "wheels $wheel_key: cached"
else
  progress "wheels $wheel_key: pip download ($(echo "$deps" | wc -l) dependencies + build requirements)"
  t0=$(date +%s)
  rm -rf "$wheels.tmp" && mkdir -p "$wheels.tmp"
  # shellcheck disable=SC2086  # one requirement per line, no spaces inside one
  "$PYTHON" -m pip download --quiet --only-binary=:all: --dest "$wheels.tmp" $deps $build_req >&2
  touch "$wheels.tmp/.complete" && rm -rf "$wheels" && mv "$wheels.tmp" "$wheels"
  echo "    wheels downloaded in $(since "$t0")" >&2
fi

# ---- the image ----
version=$("$PYTHON" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
  "$repo/pyproject.toml")
image=localhost/gpupack:$version
revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
# gpupack-runc is built in the Dockerfile's handler stage with the host's Go toolchain (no registry).
goroot=$(go env GOROOT 2>/dev/null) || { echo "needs Go (go on PATH) for the gpupack-runc handler" >&2; exit 2; }
progress "image $image: buildah bud on $base"
t0=$(date +%s)
"${B[@]}" bud --quiet --isolation chroot --pull=never \
  --build-arg BASE_IMAGE="$base" --build-arg REVISION="$revision" \
  --build-arg PIP_ARGS="--no-index --find-links=/wheels" --volume "$wheels:/wheels:ro" \
  --build-arg GO_IMAGE="$base" --volume "$goroot:/usr/local/go:ro" \
  -t "$image" "$repo" >&2
# The previous build of the tag is now untagged: drop it, or the cache grows by an image per build.
"${B[@]}" rmi --prune >/dev/null 2>&1 || true
# Smoke test: the entrypoint runs as the image's user.
ctr=$("${B[@]}" from --pull=never "$image")
trap '"${B[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
"${B[@]}" run --isolation chroot "$ctr" -- gpupack --help >/dev/null
if [ "$standins" = 1 ]; then
  # Test builds only: the stand-in MPS control daemon, on top of the product image, under the same tag.
  "${B[@]}" copy --chown 0:0 --chmod 0755 "$ctr" "$repo/tests/standin/mps_control.py" \
    /opt/gpupack-standin/nvidia-cuda-mps-control >/dev/null
  "${B[@]}" config --label io.gpupack.standins=mps-control "$ctr"
  "${B[@]}" commit --quiet "$ctr" "$image" >&2
  "${B[@]}" rmi --prune >/dev/null 2>&1 || true
  echo "    stand-ins added: /opt/gpupack-standin/nvidia-cuda-mps-control (tests only)" >&2
fi
user=$("${B[@]}" inspect --type image --format '{{.OCIv1.Config.User}}' "$image")
size=$("${B[@]}" images --format '{{.Size}}' "$image" | head -1)
echo "    image built in $(since "$t0"): user $user, $size" >&2
if [ -n "$archive" ]; then
  rm -f "$archive"
  "${B[@]}" push --quiet "$image" "docker-archive:$archive:$image" >&2
  echo "    archive: $archive ($(du -h "$archive" | cut -f1))" >&2
fi
echo "$image"

#!/usr/bin/env bash
# Builds the project's image with buildah and smoke-runs it (`make image`; CI runs `make image-ci`).
#
#   images/build.sh                 # FROM python:3.12-slim (needs a registry), tag localhost/hami-python:<version>
#   images/build.sh --debian-base   # bases made from Debian packages with mmdebstrap (no registry needed), as CI
#
# Debian bases are cached as tarballs in ${HAMI_IMAGE_CACHE:-~/.cache/hami-image}, keyed by their package list,
# so a rebuild only re-imports them. buildah runs with the vfs storage driver and chroot isolation, which work as
# root without overlay or user namespaces (reference: docs/install.md). The host's CA bundle is mounted into the
# build's RUN steps, so pip reaches PyPI through the same TLS trust as the host.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/hami/Chart.yaml)"
tag="${HAMI_IMAGE:-localhost/hami-python:$version}"
storage=(--storage-driver "${BUILDAH_STORAGE_DRIVER:-vfs}")
log() { printf '[image] %s\n' "$*" >&2; }
command -v buildah >/dev/null || { log "buildah is not installed (Debian: apt-get install -y buildah mmdebstrap)"; exit 3; }

build_args=()
if [[ "${1:-}" == "--debian-base" ]]; then
  command -v mmdebstrap >/dev/null || { log "mmdebstrap is not installed (apt-get install -y mmdebstrap)"; exit 3; }
  cache="${HAMI_IMAGE_CACHE:-$HOME/.cache/hami-image}"
  mkdir -p "$cache"
  base_image() {  # name, comma-separated packages -> a local image made from Debian bookworm
    local name="$1" packages="$2" key tar
    key="$(printf '%s' "bookworm minbase $packages" | sha256sum | cut -c1-16)"
    tar="$cache/$name-$key.tar"
    if [[ ! -s "$tar" ]]; then
      log "making $name from Debian packages ($packages) into $tar"
      mmdebstrap --quiet --variant=minbase --include="$packages" bookworm "$tar.partial"
      mv "$tar.partial" "$tar"
    fi
    if ! buildah "${storage[@]}" inspect --type image "localhost/$name:$key" >/dev/null 2>&1; then
      local c
      c="$(buildah "${storage[@]}" from scratch)"
      buildah "${storage[@]}" add "$c" "$tar" / >/dev/null
      buildah "${storage[@]}" commit --quiet "$c" "localhost/$name:$key" >/dev/null
      buildah "${storage[@]}" rm "$c" >/dev/null
    fi
    printf 'localhost/%s:%s' "$name" "$key"
  }
  build_args+=(--build-arg "BASE=$(base_image hami-base python3,python3-venv)")
  build_args+=(--build-arg "BUILD_BASE=$(base_image hami-build-base python3,python3-venv,gcc,libc6-dev)")
fi
volumes=()
[[ -s /etc/ssl/certs/ca-certificates.crt ]] && volumes+=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)

started=$SECONDS
log "building $tag"
buildah "${storage[@]}" bud --quiet --pull-never --isolation chroot --layers "${volumes[@]}" "${build_args[@]}" \
  -f Containerfile -t "$tag" . >/dev/null
log "built $tag in $((SECONDS - started)) s; smoke-running it"
c="$(buildah "${storage[@]}" from --pull-never "$tag")"
trap 'buildah "${storage[@]}" rm "$c" >/dev/null' EXIT
buildah "${storage[@]}" run --isolation chroot -v "$root/images/smoke.py:/smoke.py:ro" "$c" -- /opt/hami/bin/python /smoke.py
log "image $tag passed its smoke run ($((SECONDS - started)) s in all)"

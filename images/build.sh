#!/usr/bin/env bash
# Builds ebb's two container images, ebb-controller and ebb-node-agent, for linux/amd64 and
# linux/arm64, without a container daemon, a registry or emulation: static musl binaries
# cross-compiled for each platform (cargo, release), a build context with them, CA certificates
# and a passwd/group entry for 65532, then images/Dockerfile (one target per image; COPY only)
# built by buildah once per platform into one multi-platform image index, exported as OCI
# archives.
#
# Usage:
#   images/build.sh [build]          binaries, context, both images, OCI archives
#   images/build.sh context          binaries and context only; prints the context directory
#                                    (for `docker build -f images/Dockerfile --target ... DIR`)
#   images/build.sh --print-dir      print the output directory, build nothing
#
# Output: ${EBB_IMAGES_CACHE:-~/.cache/ebb-images}/<tag>/
#   ebb-controller.oci.tar, ebb-node-agent.oci.tar   OCI archives, each holding one image index
#                                                    named <registry>/<name>:<tag>, one image
#                                                    per platform
#   sizes.txt                                        image and binary sizes
#   context/                                         the build context (context/<arch>/<binary>)
# The images are rebuilt only when the context or the Dockerfile changed (cargo is incremental).
#
# Environment:
#   EBB_IMAGE_REGISTRY   registry/prefix of the names (default: the chart's image.registry)
#   EBB_IMAGE_TAG        tag (default: the chart's appVersion)
#   EBB_IMAGE_PLATFORMS  comma-separated platforms (default linux/amd64,linux/arm64; each of
#                        linux/amd64 and linux/arm64)
#   EBB_IMAGE_BUILDER    buildah (default) or docker (builds and tags into the local Docker
#                        engine, the first platform only, exports nothing)
#   CARGO_TARGET_DIR     as for cargo (default: target/ in the repository)
#
# Needs: cargo with the musl target of each platform (rustup target add
# x86_64-unknown-linux-musl aarch64-unknown-linux-musl); for amd64 musl-gcc (Debian:
# musl-tools; LMDB and ring are C); for arm64 cargo-zigbuild (cargo install --locked
# cargo-zigbuild) with Zig (pip install ziglang), which cross-compiles the C parts against musl;
# Debian's ca-certificates, and buildah (Debian: buildah; run as root, or rootless with subuids).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
BINARIES=(ebb-controller ebb-node-agent)
CA_DIR=/usr/share/ca-certificates/mozilla

die() { echo "images/build.sh: error: $*" >&2; exit 1; }
log() { echo "images/build.sh: $*" >&2; }

chart_field() { # FILE KEY: a top-level scalar of a YAML file
  sed -n "s/^$2:[[:space:]]*\"\{0,1\}\([^\"#]*\)\"\{0,1\}[[:space:]]*\(#.*\)\{0,1\}\$/\1/p" "$1" | head -n1 | sed 's/[[:space:]]*$//'
}

APP_VERSION=$(chart_field "$REPO/charts/ebb/Chart.yaml" appVersion)
[[ -n $APP_VERSION ]] || die "no appVersion in charts/ebb/Chart.yaml"
# image.registry of the chart's values.yaml: the first `registry:` under `image:`
CHART_REGISTRY=$(awk '/^image:/ { in_image = 1; next } /^[^ #]/ { in_image = 0 }
  in_image && $1 == "registry:" { print $2; exit }' "$REPO/charts/ebb/values.yaml")
REGISTRY=${EBB_IMAGE_REGISTRY:-$CHART_REGISTRY}
TAG=${EBB_IMAGE_TAG:-$APP_VERSION}
[[ -n $REGISTRY ]] || die "no image.registry in charts/ebb/values.yaml (set EBB_IMAGE_REGISTRY)"
CACHE=${EBB_IMAGES_CACHE:-$HOME/.cache/ebb-images}
OUT=$CACHE/$TAG
CONTEXT=$OUT/context
BUILDER=${EBB_IMAGE_BUILDER:-buildah}
CARGO_TARGET=${CARGO_TARGET_DIR:-$REPO/target}
IFS=, read -r -a PLATFORMS <<<"${EBB_IMAGE_PLATFORMS:-linux/amd64,linux/arm64}"
[[ ${#PLATFORMS[@]} -gt 0 ]] || die "EBB_IMAGE_PLATFORMS names no platform"

arch_of() { echo "${1#linux/}"; } # PLATFORM: its architecture (amd64, arm64)
target_of() { # PLATFORM: the Rust target its binaries are built for
  case $1 in
  linux/amd64) echo x86_64-unknown-linux-musl ;;
  linux/arm64) echo aarch64-unknown-linux-musl ;;
  *) die "unsupported platform '$1' (EBB_IMAGE_PLATFORMS takes linux/amd64 and linux/arm64)" ;;
  esac
}
for p in "${PLATFORMS[@]}"; do target_of "$p" >/dev/null; done

check_tools() {
  command -v cargo >/dev/null 2>&1 || die "cargo is required (https://rustup.rs)"
  local p target
  for p in "${PLATFORMS[@]}"; do
    target=$(target_of "$p")
    if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx "$target"; then
      die "the Rust target $target ($p) is missing: rustup target add $target"
    fi
    case $p in
    linux/amd64) command -v musl-gcc >/dev/null 2>&1 ||
      die "musl-gcc is required to compile LMDB and ring for $target (Debian/Ubuntu: apt-get install musl-tools)" ;;
    linux/arm64)
      cargo zigbuild --help >/dev/null 2>&1 ||
        die "cargo-zigbuild is required to cross-compile for $target (cargo install --locked cargo-zigbuild), or set EBB_IMAGE_PLATFORMS=linux/amd64"
      command -v zig >/dev/null 2>&1 || python3 -m ziglang version >/dev/null 2>&1 ||
        die "Zig is required to cross-compile LMDB and ring for $target (pip install ziglang), or set EBB_IMAGE_PLATFORMS=linux/amd64" ;;
    esac
  done
  compgen -G "$CA_DIR/*.crt" >/dev/null ||
    die "no CA certificates in $CA_DIR (Debian/Ubuntu: apt-get install ca-certificates)"
}

check_builder() {
  case $BUILDER in
  buildah) command -v buildah >/dev/null 2>&1 || die "buildah is required (Debian/Ubuntu: apt-get install buildah), or set EBB_IMAGE_BUILDER=docker" ;;
  docker) command -v docker >/dev/null 2>&1 || die "EBB_IMAGE_BUILDER=docker but docker is not on PATH" ;;
  *) die "EBB_IMAGE_BUILDER must be buildah or docker, not '$BUILDER'" ;;
  esac
}

build_binaries() {
  local p
  for p in "${PLATFORMS[@]}"; do build_binaries_for "$p"; done
}

build_binaries_for() { # PLATFORM
  local start=$SECONDS target build
  target=$(target_of "$1")
  case $1 in
  linux/amd64) build=(env CC_x86_64_unknown_linux_musl=musl-gcc cargo build) ;;
  # Zig compiles the C parts against its own musl headers and links (no emulation, no sysroot).
  linux/arm64) build=(cargo zigbuild) ;;
  esac
  log "cargo build --release --target $target (${BINARIES[*]}) ..."
  # Debug info stays out of the images (symbol names stay, for backtraces). Run from a test,
  # the variables cargo gives a test process are dropped: the build sees what a shell's sees, and
  # stays fresh between the two.
  local drop=() v
  for v in $(compgen -e); do
    [[ $v =~ ^(CARGO_PKG_|CARGO_BIN_|CARGO_MANIFEST_|CARGO_CRATE_NAME$|CARGO_PRIMARY_PACKAGE$|CARGO_TARGET_TMPDIR$|CARGO_MAKEFLAGS$|OUT_DIR$|RUSTUP_TOOLCHAIN$) ]] && drop+=(-u "$v")
  done
  (cd "$REPO" && env "${drop[@]}" CARGO_PROFILE_RELEASE_STRIP=debuginfo \
    "${build[@]}" --release --locked --target "$target" -p ebb-controller -p ebb-node-agent) ||
    die "cargo build for $target failed"
  local b
  for b in "${BINARIES[@]}"; do
    [[ -x $CARGO_TARGET/$target/release/$b ]] || die "$CARGO_TARGET/$target/release/$b was not built"
  done
  log "$1 binaries ready in $((SECONDS - start))s"
}

# The build context: the binaries, passwd/group for 65532, Debian's CA bundle (Mozilla's roots
# only, never certificates added to this machine), all with fixed modes.
make_context() {
  local tmp b p arch
  mkdir -p "$OUT"
  tmp=$(mktemp -d "$OUT/.context.XXXXXX")
  mkdir -p "$tmp/rootfs/etc/ssl/certs"
  for p in "${PLATFORMS[@]}"; do
    arch=$(arch_of "$p")
    mkdir -p "$tmp/$arch"
    for b in "${BINARIES[@]}"; do
      install -m 0755 "$CARGO_TARGET/$(target_of "$p")/release/$b" "$tmp/$arch/$b"
    done
  done
  printf 'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n' >"$tmp/rootfs/etc/passwd"
  printf 'nonroot:x:65532:\n' >"$tmp/rootfs/etc/group"
  find "$CA_DIR" -maxdepth 1 -name '*.crt' -print0 | LC_ALL=C sort -z | xargs -0 cat \
    >"$tmp/rootfs/etc/ssl/certs/ca-certificates.crt"
  chmod 0644 "$tmp/rootfs/etc/passwd" "$tmp/rootfs/etc/group" "$tmp/rootfs/etc/ssl/certs/ca-certificates.crt"
  chmod -R u+rwX,go+rX,go-w "$tmp"
  rm -rf "$CONTEXT"
  mv "$tmp" "$CONTEXT"
}

context_hash() {
  (cd "$CONTEXT" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    sha256sum <"$HERE/Dockerfile"; echo "$REGISTRY $TAG $BUILDER ${PLATFORMS[*]}") | sha256sum | cut -c1-16
}

# buildah with its own storage under the cache (vfs: works wherever buildah does), and
# chroot isolation (no cgroups or namespaces needed; RUN is never used).
buildah_() {
  buildah --root "$CACHE/storage" --runroot "$CACHE/run" --storage-driver vfs "$@"
}

build_images() {
  local st name ref epoch start=$SECONDS
  st=$(context_hash)
  if [[ $BUILDER == buildah && "$(cat "$OUT/.stamp" 2>/dev/null)" == "$st" ]] &&
    [[ -f $OUT/ebb-controller.oci.tar && -f $OUT/ebb-node-agent.oci.tar ]]; then
    log "images $TAG: up to date"
    touch "$OUT/.stamp" # checked against these sources now (e2e/src/images.rs reads its time)
    return
  fi
  # Same inputs, same image: the creation time is the last commit's.
  epoch=$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || echo 0)
  rm -f "$OUT/.stamp"
  local p arch
  for name in "${BINARIES[@]}"; do
    ref=$REGISTRY/$name:$TAG
    log "building $ref for ${PLATFORMS[*]} ($BUILDER) ..."
    if [[ $BUILDER == docker ]]; then
      docker build -f "$HERE/Dockerfile" --target "$name" --build-arg "VERSION=$TAG" \
        --build-arg "TARGETARCH=$(arch_of "${PLATFORMS[0]}")" -t "$ref" "$CONTEXT" ||
        die "docker build of $ref failed"
      continue
    fi
    # One image per platform, added to the index named $ref (made afresh).
    buildah_ manifest rm "$ref" >/dev/null 2>&1 || true
    buildah_ rmi --force "$ref" >/dev/null 2>&1 || true
    buildah_ manifest create "$ref" >/dev/null || die "buildah manifest create $ref failed"
    for p in "${PLATFORMS[@]}"; do
      arch=$(arch_of "$p")
      buildah_ bud --quiet --isolation chroot --timestamp "$epoch" --identity-label=false \
        --platform "$p" --build-arg "TARGETARCH=$arch" \
        -f "$HERE/Dockerfile" --target "$name" --build-arg "VERSION=$TAG" --manifest "$ref" "$CONTEXT" >/dev/null ||
        die "buildah bud of $ref for $p failed"
    done
    rm -f "$OUT/$name.oci.tar"
    buildah_ manifest push --quiet --all "$ref" "oci-archive:$OUT/$name.oci.tar:$ref" ||
      die "exporting $ref to $OUT/$name.oci.tar failed"
  done
  [[ $BUILDER == docker ]] && { log "built into Docker in $((SECONDS - start))s"; return; }
  {
    echo "# image index: OCI archive bytes (gzip layers, every platform), platforms"
    echo "# image, platform: unpacked bytes, binary bytes"
    for name in "${BINARIES[@]}"; do
      echo "$REGISTRY/$name:$TAG archive=$(stat -c %s "$OUT/$name.oci.tar") platforms=$(IFS=,; echo "${PLATFORMS[*]}")"
      for p in "${PLATFORMS[@]}"; do
        arch=$(arch_of "$p")
        echo "$REGISTRY/$name:$TAG platform=$p unpacked=$(($(stat -c %s "$CONTEXT/$arch/$name") + $(du -sb "$CONTEXT/rootfs" | cut -f1))) binary=$(stat -c %s "$CONTEXT/$arch/$name")"
      done
    done
  } >"$OUT/sizes.txt"
  echo "$st" >"$OUT/.stamp"
  log "images built and exported in $((SECONDS - start))s:"
  sed 's/^/  /' "$OUT/sizes.txt" >&2
}

main() {
  case ${1:-build} in
  --print-dir) echo "$OUT" ;;
  -h | --help | help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
  context)
    check_tools
    build_binaries
    make_context
    echo "$CONTEXT"
    ;;
  build)
    check_tools
    check_builder
    build_binaries
    make_context
    build_images
    echo "$OUT"
    ;;
  *) die "unknown command '$1' (try --help)" ;;
  esac
}

main "$@"

#!/usr/bin/env bash
# Builds ebb's two container images, ebb-controller and ebb-node-agent, without a container
# daemon and without a registry: static binaries for x86_64-unknown-linux-musl (cargo, release),
# a build context with them, CA certificates and a passwd/group entry for 65532, then
# images/Dockerfile (one target per image) built by buildah, exported as OCI archives.
#
# Usage:
#   images/build.sh [build]          binaries, context, both images, OCI archives
#   images/build.sh context          binaries and context only; prints the context directory
#                                    (for `docker build -f images/Dockerfile --target ... DIR`)
#   images/build.sh --print-dir      print the output directory, build nothing
#
# Output: ${EBB_IMAGES_CACHE:-~/.cache/ebb-images}/<tag>/
#   ebb-controller.oci.tar, ebb-node-agent.oci.tar   OCI archives, each holding one image
#                                                    named <registry>/<name>:<tag>
#   sizes.txt                                        image and binary sizes
#   context/                                         the build context
# The images are rebuilt only when the context or the Dockerfile changed (cargo is incremental).
#
# Environment:
#   EBB_IMAGE_REGISTRY   registry/prefix of the names (default: the chart's image.registry)
#   EBB_IMAGE_TAG        tag (default: the chart's appVersion)
#   EBB_IMAGE_BUILDER    buildah (default) or docker (builds and tags into the local Docker
#                        engine, exports nothing)
#   CARGO_TARGET_DIR     as for cargo (default: target/ in the repository)
#
# Needs: cargo with the x86_64-unknown-linux-musl target (rustup target add
# x86_64-unknown-linux-musl), musl-gcc (Debian: musl-tools; LMDB and ring are C), Debian's
# ca-certificates, and buildah (Debian: buildah; run as root, or rootless with subuids).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
TARGET=x86_64-unknown-linux-musl
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

check_tools() {
  command -v cargo >/dev/null 2>&1 || die "cargo is required (https://rustup.rs)"
  if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx "$TARGET"; then
    die "the Rust target $TARGET is missing: rustup target add $TARGET"
  fi
  command -v musl-gcc >/dev/null 2>&1 ||
    die "musl-gcc is required to compile LMDB and ring for $TARGET (Debian/Ubuntu: apt-get install musl-tools)"
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
  local start=$SECONDS
  log "cargo build --release --target $TARGET (${BINARIES[*]}) ..."
  # Debug info stays out of the images (symbol names stay, for backtraces). Run from a test,
  # the variables cargo gives a test process are dropped: the build sees what a shell's sees, and
  # stays fresh between the two.
  local drop=() v
  for v in $(compgen -e); do
    [[ $v =~ ^(CARGO_PKG_|CARGO_BIN_|CARGO_MANIFEST_|CARGO_CRATE_NAME$|CARGO_PRIMARY_PACKAGE$|CARGO_TARGET_TMPDIR$|CARGO_MAKEFLAGS$|OUT_DIR$|RUSTUP_TOOLCHAIN$) ]] && drop+=(-u "$v")
  done
  (cd "$REPO" && env "${drop[@]}" CC_x86_64_unknown_linux_musl=musl-gcc CARGO_PROFILE_RELEASE_STRIP=debuginfo \
    cargo build --release --locked --target "$TARGET" -p ebb-controller -p ebb-node-agent) ||
    die "cargo build for $TARGET failed"
  local b
  for b in "${BINARIES[@]}"; do
    [[ -x $CARGO_TARGET/$TARGET/release/$b ]] || die "$CARGO_TARGET/$TARGET/release/$b was not built"
  done
  log "binaries ready in $((SECONDS - start))s"
}

# The build context: the binaries, passwd/group for 65532, Debian's CA bundle (Mozilla's roots
# only, never certificates added to this machine), all with fixed modes.
make_context() {
  local tmp b
  mkdir -p "$OUT"
  tmp=$(mktemp -d "$OUT/.context.XXXXXX")
  mkdir -p "$tmp/rootfs/etc/ssl/certs"
  for b in "${BINARIES[@]}"; do
    install -m 0755 "$CARGO_TARGET/$TARGET/release/$b" "$tmp/$b"
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
    sha256sum <"$HERE/Dockerfile"; echo "$REGISTRY $TAG $BUILDER") | sha256sum | cut -c1-16
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
  for name in "${BINARIES[@]}"; do
    ref=$REGISTRY/$name:$TAG
    log "building $ref ($BUILDER) ..."
    if [[ $BUILDER == docker ]]; then
      docker build -f "$HERE/Dockerfile" --target "$name" --build-arg "VERSION=$TAG" -t "$ref" "$CONTEXT" ||
        die "docker build of $ref failed"
      continue
    fi
    buildah_ bud --quiet --isolation chroot --timestamp "$epoch" --identity-label=false \
      -f "$HERE/Dockerfile" --target "$name" --build-arg "VERSION=$TAG" -t "$ref" "$CONTEXT" >/dev/null ||
      die "buildah bud of $ref failed"
    rm -f "$OUT/$name.oci.tar"
    buildah_ push --quiet "$ref" "oci-archive:$OUT/$name.oci.tar:$ref" ||
      die "exporting $ref to $OUT/$name.oci.tar failed"
  done
  [[ $BUILDER == docker ]] && { log "built into Docker in $((SECONDS - start))s"; return; }
  {
    echo "# image: OCI archive bytes (gzip layers), unpacked bytes; binary bytes"
    for name in "${BINARIES[@]}"; do
      echo "$REGISTRY/$name:$TAG archive=$(stat -c %s "$OUT/$name.oci.tar") unpacked=$(($(stat -c %s "$CONTEXT/$name") + $(du -sb "$CONTEXT/rootfs" | cut -f1))) binary=$(stat -c %s "$CONTEXT/$name")"
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

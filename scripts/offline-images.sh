#!/usr/bin/env bash
# The base images the Dockerfile and docker-compose.yml name, for a host that cannot pull
# from the image hub: built from Debian packages and tagged with the standard names, so the
# `FROM` and `image:` lines stay the same for everyone else. With the hub reachable it
# pulls them instead (OFFLINE_IMAGES=force builds them anyway).
#   debian:bookworm-slim       a debootstrap (minbase) rootfs, `docker import`ed
#   python:3.11-slim-bookworm  Debian's python3 (3.11)            deploy/offline-images/python
#   node:20-bookworm-slim      the host's Node.js 20 and npm      deploy/offline-images/node
#   postgres:15-bookworm       Debian's PostgreSQL 15             deploy/offline-images/postgres
#   redis:7-bookworm           Debian's Redis 7                   deploy/offline-images/redis
# The rootfs is kept in the cache folder and images already present are kept, so a second
# run takes seconds. The Debian mirror is the host's own apt source.
# Usage: scripts/offline-images.sh        (needs root for debootstrap, and docker)
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${CHATAPP_CACHE_DIR:-$HOME/.cache/chatapp}/offline-images"
HERE=deploy/offline-images
IMAGES=(debian:bookworm-slim python:3.11-slim-bookworm node:20-bookworm-slim postgres:15-bookworm redis:7-bookworm)
say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
have() { docker image inspect "$1" >/dev/null 2>&1; }

missing=()
for image in "${IMAGES[@]}"; do have "$image" || missing+=("$image"); done
if [ ${#missing[@]} -eq 0 ] && [ "${OFFLINE_IMAGES:-}" != force ]; then
  say "base images present: ${IMAGES[*]}"
  exit 0
fi
if [ "${OFFLINE_IMAGES:-}" != force ] && timeout 60 docker pull -q "${missing[0]}" >/dev/null 2>&1; then
  say "the image hub answers: pulling"
  for image in "${missing[@]}"; do docker pull -q "$image"; done
  exit 0
fi
say "the image hub does not answer: building ${missing[*]:-all} from Debian packages"

# The mirror this host's apt uses (deb822 or one-line sources).
mirror="$(grep -h -o -E 'https?://[^ ]+/debian/?' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | head -1 || true)"
mirror="${mirror:-http://deb.debian.org/debian}"
mirror="${mirror%/}"
security="${mirror%/debian}/debian-security"

if ! have debian:bookworm-slim || [ "${OFFLINE_IMAGES:-}" = force ]; then
  mkdir -p "$CACHE"
  if [ ! -s "$CACHE/rootfs.tar" ]; then
    command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }
    say "debootstrap bookworm from $mirror (once, a few minutes)"
    rm -rf "$CACHE/rootfs"
    debootstrap --variant=minbase --include=ca-certificates bookworm "$CACHE/rootfs" "$mirror"
    cat > "$CACHE/rootfs/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb $security bookworm-security main
SOURCES
    # As the official slim image: no package lists, no docs, no apt cache in the layer.
    rm -rf "$CACHE/rootfs/var/lib/apt/lists/"* "$CACHE/rootfs/var/cache/apt/"*.bin \
      "$CACHE/rootfs/usr/share/doc/"* "$CACHE/rootfs/usr/share/man/"*
    tar -C "$CACHE/rootfs" -cf "$CACHE/rootfs.tar.partial" .
    mv "$CACHE/rootfs.tar.partial" "$CACHE/rootfs.tar"
    rm -rf "$CACHE/rootfs"
  fi
  say "docker import debian:bookworm-slim"
  docker import --change 'CMD ["bash"]' --change 'ENV LANG=C.UTF-8' "$CACHE/rootfs.tar" debian:bookworm-slim >/dev/null
fi

build() {  # tag, folder
  if have "$1" && [ "${OFFLINE_IMAGES:-}" != force ]; then return; fi
  say "docker build $1"
  DOCKER_BUILDKIT=0 docker build -q --network host -t "$1" "$2" >/dev/null
}
build python:3.11-slim-bookworm "$HERE/python"
if ! have node:20-bookworm-slim || [ "${OFFLINE_IMAGES:-}" = force ]; then
  # The host's own Node.js 20 and npm (Debian bookworm carries Node 18), as installed:
  # the binary and npm's folder, which npm may have updated past its package's file list.
  command -v node >/dev/null || { echo "node is missing: the frontend stage needs Node.js 20" >&2; exit 1; }
  node_ctx="$(mktemp -d)"
  trap 'rm -rf "$node_ctx"' EXIT
  npm_dir="$(dirname "$(dirname "$(readlink -f "$(command -v npm)")")")"
  mkdir -p "$node_ctx/root/usr/local/bin" "$node_ctx/root/usr/local/lib/node_modules"
  cp "$(readlink -f "$(command -v node)")" "$node_ctx/root/usr/local/bin/node"
  cp -a "$npm_dir" "$node_ctx/root/usr/local/lib/node_modules/npm"
  ln -s ../lib/node_modules/npm/bin/npm-cli.js "$node_ctx/root/usr/local/bin/npm"
  ln -s ../lib/node_modules/npm/bin/npx-cli.js "$node_ctx/root/usr/local/bin/npx"
  tar -C "$node_ctx/root" -cf "$node_ctx/node.tar" . && rm -rf "$node_ctx/root"
  cp "$HERE/node/Dockerfile" "$node_ctx/"
  build node:20-bookworm-slim "$node_ctx"
fi
build postgres:15-bookworm "$HERE/postgres"
build redis:7-bookworm "$HERE/redis"
say "base images built: ${IMAGES[*]}"

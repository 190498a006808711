#!/usr/bin/env bash
# make image: builds the CPU image (docker/Dockerfile.cpu) with podman on a Debian 12 base made
# here by debootstrap, because these machines reach Debian's mirrors but no image registry.
#   scripts/image.sh            -> image fathom:cpu (IMAGE_TAG overrides), its size on stdout
# Steps, each skipped when its result exists:
#   1. apt-get install podman, buildah, debootstrap, runc and the rootless helpers
#   2. debootstrap --variant=minbase bookworm, trimmed like debian:12-slim (no docs, man pages or
#      locales; dpkg told to keep them out), as a tarball in $FATHOM_CACHE (default
#      ~/.cache/fathom) -> `podman import` as localhost/fathom-debian:12-r2
#   3. podman build, that base as both BASE_IMAGE and RUNTIME_IMAGE, with the options this machine
#      needs (scripts/podman_flags.sh), niced: the compile inside takes 13-26 min on 2 shared cores.
# Needs root for debootstrap (sudo when not root). The smoke test: tests/image/test_container_image.py.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${FATHOM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fathom}
tag=${IMAGE_TAG:-fathom:cpu}
# r2: the recipe's revision; a new one makes a new base (the old tarball and image stay cached).
base=localhost/fathom-debian:12-r2
tarball=$cache/debian12-minbase-r2.tar
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"

packages=(podman buildah debootstrap runc crun uidmap slirp4netns fuse-overlayfs containernetworking-plugins)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "image: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -s "$tarball" ]; then
  echo "image: debootstrap Debian 12 (minbase) from $mirror"
  mkdir -p "$cache"
  root=$cache/debian12-rootfs.tmp
  $SUDO rm -rf "$root"
  $SUDO nice -n 10 debootstrap --variant=minbase bookworm "$root" "$mirror" >/dev/null
  # As debian:12's sources (updates and security), and debian:12-slim's dpkg excludes.
  $SUDO tee "$root/etc/apt/sources.list" >/dev/null <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SOURCES
  # debian:12's docker-clean: apt keeps no package caches (2 x 40 MB) and no downloaded .debs.
  $SUDO tee "$root/etc/apt/apt.conf.d/docker-clean" >/dev/null <<'CLEAN'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CLEAN
  $SUDO tee "$root/etc/dpkg/dpkg.cfg.d/slim" >/dev/null <<'SLIM'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
SLIM
  $SUDO find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  $SUDO rm -rf "$root"/usr/share/{man,info,locale,lintian}/* "$root"/var/cache/apt/archives/*.deb \
    "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* "$root"/var/log/*.log
  $SUDO tar --numeric-owner -C "$root" -cf "$tarball.tmp" .
  $SUDO chown "$(id -u):$(id -g)" "$tarball.tmp"
  mv "$tarball.tmp" "$tarball"
  $SUDO rm -rf "$root"
fi
if ! podman image exists "$base"; then
  podman import --quiet --change 'CMD ["bash"]' "$tarball" "$base" >/dev/null
fi

if ! flags=$(scripts/podman_flags.sh "$base"); then
  echo "image: podman cannot run a container on this machine (errors above)" >&2
  exit 1
fi
echo "image: podman build -f docker/Dockerfile.cpu -t $tag (options: ${flags:-none})"
# --format docker: the OCI image format has no HEALTHCHECK; podman drops it without this.
# The secret: this machine's CA bundle for the build's HTTPS to PyPI (xgrammar's sdist), which
# a TLS-intercepting network re-signs with a CA only the host trusts.
secret=()
ca=/etc/ssl/certs/ca-certificates.crt
[ -s "$ca" ] && secret=(--secret "id=ca-certificates,src=$ca")
# shellcheck disable=SC2086  # flags is a list of words
nice -n 10 podman build $flags --format docker "${secret[@]}" \
  --build-arg BASE_IMAGE="$base" --build-arg RUNTIME_IMAGE="$base" \
  -f docker/Dockerfile.cpu -t "$tag" .
size=$(podman image inspect --format '{{.Size}}' "$tag")
echo "image: $tag built, $((size / 1000000)) MB"

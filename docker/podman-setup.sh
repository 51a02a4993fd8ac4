#!/usr/bin/env bash
# Makes podman usable on a Debian 12 host that cannot pull images: installs podman, runc and
# debootstrap, and builds the base image the Dockerfile names (debian:bookworm-slim) from
# Debian's own packages. Idempotent. Then, from the repository root:
#   export CONTAINERS_CONF=/tmp/inferscope-containers.conf
#   podman --runtime runc --cgroup-manager cgroupfs build --format docker -t inferscope \
#     -f docker/Dockerfile --target prebuilt .
set -euo pipefail
need=()
for cmd in podman runc debootstrap; do command -v "$cmd" >/dev/null 2>&1 || need+=("$cmd"); done
if ((${#need[@]})); then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
conf=${CONTAINERS_CONF:-/tmp/inferscope-containers.conf}
# podman's default ulimits are refused on these hosts.
[ -f "$conf" ] || printf '[containers]\ndefault_ulimits = []\n' > "$conf"
export CONTAINERS_CONF=$conf
P=(podman --runtime runc --cgroup-manager cgroupfs)
if ! "${P[@]}" image exists docker.io/library/debian:bookworm-slim; then
  root=$(mktemp -d)
  debootstrap --variant=minbase bookworm "$root" >/dev/null
  tar -C "$root" -c . | "${P[@]}" import - docker.io/library/debian:bookworm-slim >/dev/null
  rm -rf "$root"
fi
echo "podman ready (CONTAINERS_CONF=$conf)"

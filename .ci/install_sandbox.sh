#!/usr/bin/env bash
# The sandboxes agl runs command-line agents and model-written programs in (agl.capture.sandbox, docs/security.md),
# from the distribution's own packages: bubblewrap (the default sandbox), and podman with runc (the container sandbox;
# crun, podman's default on Debian, refuses hybrid cgroup hierarchies) with busybox-static, from which the container
# tests make their image. Then a check that bubblewrap can create the namespaces it needs here (unprivileged user
# namespaces on). Beside `make browser` in CI: apt waits for the other's lock (DPkg::Lock::Timeout) instead of failing.
set -euo pipefail
packages=()
command -v bwrap >/dev/null || packages+=(bubblewrap)
command -v podman >/dev/null || packages+=(podman)
command -v runc >/dev/null || packages+=(runc)
[ -x /usr/bin/busybox ] || packages+=(busybox-static)
if [ "${#packages[@]}" -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
  if command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt=($SUDO apt-get -o DPkg::Lock::Timeout=600)
    "${apt[@]}" install -y -qq --no-install-recommends "${packages[@]}" >/dev/null 2>&1 \
      || { "${apt[@]}" update -qq && "${apt[@]}" install -y -qq --no-install-recommends "${packages[@]}" >/dev/null; }
  elif command -v dnf >/dev/null; then
    $SUDO dnf install -y -q bubblewrap podman runc busybox
  else
    echo "install bubblewrap (and podman, runc for the container sandbox) with your system's package manager" >&2
    exit 1
  fi
fi
bwrap --unshare-user --unshare-pid --unshare-net --ro-bind / / --proc /proc true \
  || { echo "bwrap cannot create namespaces here: enable unprivileged user namespaces (docs/security.md)" >&2; exit 1; }
bwrap --version
podman --runtime runc info >/dev/null && podman --version

#!/usr/bin/env bash
# bubblewrap, the sandbox every command-line agent and every program an evaluator runs goes into by default
# (agl.capture.sandbox, docs/security.md), from the distribution's own package; then a check that it can create the
# namespaces it needs here (unprivileged user namespaces on). Beside `make browser` in CI: apt waits for the other's
# lock (DPkg::Lock::Timeout) instead of failing.
set -euo pipefail
if ! command -v bwrap >/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
  if command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends bubblewrap >/dev/null 2>&1 \
      || { $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq && $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends bubblewrap >/dev/null; }
  elif command -v dnf >/dev/null; then
    $SUDO dnf install -y -q bubblewrap
  else
    echo "install bubblewrap (bwrap) with your system's package manager, or run agents bare with sandbox='none'" >&2
    exit 1
  fi
fi
bwrap --unshare-user --unshare-pid --unshare-net --ro-bind / / --proc /proc true \
  || { echo "bwrap cannot create namespaces here: enable unprivileged user namespaces (docs/security.md)" >&2; exit 1; }
bwrap --version

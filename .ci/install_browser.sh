#!/usr/bin/env bash
# Headless Chromium for the dashboard's browser tests (tests/test_dashboard_browser.py), from Debian's own
# `chromium` package; Playwright drives it at /usr/bin/chromium and never downloads a browser of its own.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends chromium >/dev/null
/usr/bin/chromium --version

#!/usr/bin/env bash
# Install Debian's `chromium` for the HTML report test (tests/report/test_html.py opens the
# report headless, dumps its DOM and takes a screenshot). Idempotent: does nothing when a
# chromium binary is already on PATH. Needs root (CI containers are) and the Debian apt sources.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "chromium: not installed and not root; run: sudo apt-get install chromium" >&2
    exit 1
fi
echo "chromium: installing Debian's chromium package"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
command -v chromium >/dev/null

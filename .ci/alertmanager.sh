#!/usr/bin/env bash
# Provide a real Alertmanager for tests/alerts/test_alertmanager.py, in the git-ignored
# .cache/alertmanager (nothing installed system-wide).
#
# Alertmanager ships in Debian's `prometheus-alertmanager` package. Installing the package
# would add a systemd unit and a running daemon, so this only downloads the .deb (`apt-get
# download`, the distribution's own client and mirror) and unpacks it with `dpkg -x`; the
# binary is static. Idempotent: a stamp records the package version, and a second run with
# the same candidate version does nothing.
#
# Debian's build reads its default notification templates from the absolute directory
# /usr/share/prometheus/alertmanager, and the templates themselves are shipped in the source package
# golang-github-prometheus-alertmanager-dev. To keep everything under .cache, the templates are
# taken from that package into .cache/alertmanager/tmpl/, and the one path constant in our copy
# of the binary is rewritten to a relative path of the same length (./././.../tmpl); the test
# fixture runs Alertmanager with .cache/alertmanager as its working directory.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/.cache/alertmanager"
PKG=prometheus-alertmanager
mkdir -p "$DEST"

# The version apt would install; after an `apt-get update` that finds a newer one, this reinstalls.
version="$(apt-cache policy "$PKG" 2>/dev/null | sed -n 's/^ *Candidate: *//p')"
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
    echo "alertmanager: no '$PKG' package in the apt sources (run apt-get update)" >&2
    exit 1
fi

if [ ! -x "$DEST/bin/alertmanager" ] || [ ! -f "$DEST/stamp" ] || [ "$(cat "$DEST/stamp")" != "$version" ]; then
    echo "alertmanager: from Debian's $PKG $version"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    # apt-get download writes into the current directory; as root it warns that the _apt
    # user cannot write there (the download is then done unsandboxed), which is harmless.
    (cd "$tmp" && apt-get download -qq "$PKG=$version" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
    deb="$(ls "$tmp"/${PKG}_*.deb 2>/dev/null | head -n 1)"
    [ -n "$deb" ] || { echo "alertmanager: apt-get download $PKG=$version failed" >&2; exit 1; }
    dpkg -x "$deb" "$tmp/root"
    (cd "$tmp" && apt-get download -qq golang-github-prometheus-alertmanager-dev 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
    dev="$(ls "$tmp"/golang-github-prometheus-alertmanager-dev_*.deb 2>/dev/null | head -n 1)"
    [ -n "$dev" ] || { echo "alertmanager: apt-get download golang-github-prometheus-alertmanager-dev failed" >&2; exit 1; }
    dpkg -x "$dev" "$tmp/dev"
    mkdir -p "$DEST/bin" "$DEST/tmpl"
    install -m 0644 "$tmp"/dev/usr/share/gocode/src/github.com/prometheus/alertmanager/template/*.tmpl "$DEST/tmpl/"
    python3 - "$tmp/root/usr/bin/prometheus-alertmanager" "$DEST/bin/alertmanager" <<'PY'
import sys
from pathlib import Path

old = b"/usr/share/prometheus/alertmanager"
new = b"./" * ((len(old) - len(b"tmpl")) // 2) + b"tmpl"
assert len(new) == len(old), (new, old)
data = Path(sys.argv[1]).read_bytes()
if data.count(old) == 0:
    sys.exit("alertmanager: the template path constant was not found in the binary")
Path(sys.argv[2]).write_bytes(data.replace(old, new))
PY
    chmod 0755 "$DEST/bin/alertmanager"
    printf '%s' "$version" >"$DEST/stamp"
fi

echo "alertmanager: ready: $("$DEST/bin/alertmanager" --version 2>&1 | head -n 1)"

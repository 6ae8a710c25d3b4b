#!/usr/bin/env bash
# Install promtool into the git-ignored .tools/bin, for the chart's PrometheusRule tests
# (`promtool check rules`, `promtool test rules` in tests/chart/).
#
# promtool ships in Debian's `prometheus` package. Installing that package would pull a web UI's
# JavaScript dependencies and a server with a systemd unit, so this only downloads the .deb
# (`apt-get download`, the distribution's own client and mirror) and copies the one static
# binary out of it. Idempotent: a stamp records the package version, and a second run with
# the same candidate version does nothing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"
STAMPS="$TOOLS/stamps"
mkdir -p "$TOOLS/bin" "$STAMPS"

# The version apt would install; after an `apt-get update` that finds a newer one, this reinstalls.
version="$(apt-cache policy prometheus 2>/dev/null | sed -n 's/^ *Candidate: *//p')"
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
    echo "promtool: no 'prometheus' package in the apt sources (run apt-get update)" >&2
    exit 1
fi

if [ ! -x "$TOOLS/bin/promtool" ] || [ ! -f "$STAMPS/promtool" ] || [ "$(cat "$STAMPS/promtool")" != "$version" ]; then
    echo "promtool: from Debian's prometheus $version"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    # apt-get download writes into the current directory; as root it warns that the _apt
    # user cannot write there (the download is then done unsandboxed), which is harmless.
    (cd "$tmp" && apt-get download -qq "prometheus=$version" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
    deb="$(ls "$tmp"/prometheus_*.deb 2>/dev/null | head -n 1)"
    [ -n "$deb" ] || { echo "promtool: apt-get download prometheus=$version failed" >&2; exit 1; }
    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp" ./usr/bin/promtool
    install -m 0755 "$tmp/usr/bin/promtool" "$TOOLS/bin/promtool"
    printf '%s' "$version" >"$STAMPS/promtool"
fi

echo "promtool: ready: $("$TOOLS/bin/promtool" --version 2>&1 | head -n 1)"

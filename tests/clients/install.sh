#!/usr/bin/env bash
# Installs the agent clients tests/agents.rs drives, none of them written by the mop team:
# the official MCP Python SDK (PyPI `mcp`), the MCP Inspector CLI, Claude Code and Codex
# (npm). They go under /usr/local/lib/mop-test-clients, which is inside /usr, so every
# sandbox sees them read-only. Versions are pinned here and in package-lock.json; a stamp
# file skips the work when they are already installed.
#
#   bash tests/clients/install.sh            # as root (CI runs it from .ci/run)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="${MOP_TEST_CLIENTS:-/usr/local/lib/mop-test-clients}"
mcp_python=2.3.0
stamp="mcp==$mcp_python $(sha256sum "$here/package-lock.json" | cut -c1-16)"
if [ "$(cat "$dest/.installed" 2>/dev/null)" = "$stamp" ]; then
  echo "agent clients: already installed in $dest"
  exit 0
fi
mkdir -p "$dest"
# The SDK runs under Debian's /usr/bin/python3 inside the sandbox: install for that
# interpreter's version, with whichever pip this machine has.
pyver="$(/usr/bin/python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
pip=(python3 -m pip)
"${pip[@]}" --version >/dev/null 2>&1 || pip=(/usr/bin/python3 -m pip)
echo "agent clients: mcp==$mcp_python for Python $pyver into $dest/python"
rm -rf "$dest/python"
"${pip[@]}" install --quiet --disable-pip-version-check --no-compile --no-warn-conflicts --root-user-action=ignore \
  --python-version "$pyver" --only-binary=:all: --target "$dest/python" "mcp==$mcp_python"
echo "agent clients: npm ci (inspector, claude-code, codex) into $dest/node"
rm -rf "$dest/node"
mkdir -p "$dest/node"
cp "$here/package.json" "$here/package-lock.json" "$dest/node/"
(cd "$dest/node" && npm ci --no-audit --no-fund --loglevel=error)
chmod -R a+rX "$dest"
echo "$stamp" > "$dest/.installed"

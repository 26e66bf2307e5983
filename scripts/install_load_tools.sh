#!/usr/bin/env bash
# Install the field's load tools that tests/real/test_load_tools.py runs against the simulated
# server, each in a venv of its own under .thermab/ (docs/load-tools.md):
#   AIPerf (NVIDIA's ai-dynamo/aiperf) in .thermab/aiperf-venv: ~1.2 GB, no torch.
# GuideLLM is not installed: it requires torch unconditionally, and PyPI's torch brings
# CUDA's libraries (a 6.0 GB venv), too much for CI to install for one test.
# Idempotent: a venv holding the pinned version, with its command, is reused at once (a
# second); one that does not is repaired in place. --force recreates it from scratch.
#
# Environment: THERMAB_AIPERF_VENV (venv path, default $THERMAB_CACHE/aiperf-venv, THERMAB_CACHE
# defaulting to ~/.cache/thermab, linked from .thermab/aiperf-venv in the checkout),
# THERMAB_AIPERF_SPEC (default aiperf==0.13.0), THERMAB_LOAD_TOOLS_PYTHON (the Python that
# creates it, default python3; AIPerf needs >= 3.10).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
# The venv lives in the user's cache, shared by every checkout on the machine (a fresh clone
# reuses it at once), and .thermab/aiperf-venv in the checkout links to it; a real venv
# already there is used as it is.
LINK=$REPO/.thermab/aiperf-venv
if [ -d "$LINK" ] && [ ! -L "$LINK" ]; then DEFAULT_VENV=$LINK; else
  DEFAULT_VENV=${THERMAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/thermab}/aiperf-venv; fi
VENV=${THERMAB_AIPERF_VENV:-$DEFAULT_VENV}
SPEC=${THERMAB_AIPERF_SPEC:-aiperf==0.13.0}
BASE_PYTHON=${THERMAB_LOAD_TOOLS_PYTHON:-python3}
PY="$VENV/bin/python"
FORCE=0

for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "install_load_tools.sh: unknown argument $arg (only --force)" >&2; exit 2 ;;
  esac
done

say() { printf 'install_load_tools: %s\n' "$*"; }
started=$(date +%s)
# .thermab/<venv> in the checkout names the venv wherever it lives
link_checkout() {
  [ "$VENV" = "$LINK" ] && return 0
  if [ -L "$LINK" ] || [ ! -e "$LINK" ]; then mkdir -p "$(dirname "$LINK")" && ln -sfn "$VENV" "$LINK"; fi
}

# the installed version when it is the pinned one and its command is there, else why not
check() {
  [ -x "$PY" ] || { echo "no venv"; return 1; }
  "$PY" - "$SPEC" "$VENV/bin/aiperf" <<'EOF'
import importlib.metadata as md
import os
import sys

name, _, wanted = sys.argv[1].partition("==")
try:
    have = md.version(name)
except md.PackageNotFoundError:
    sys.exit(f"{name} is not installed")
if wanted and have != wanted:
    sys.exit(f"{name} {have} is installed, {wanted} wanted")
if not os.access(sys.argv[2], os.X_OK):
    sys.exit(f"no {sys.argv[2]}")
print(f"{name} {have} in {sys.prefix}")
EOF
}

if [ "$FORCE" = 1 ] && [ -e "$VENV" ]; then
  say "--force: removing $VENV"
  rm -rf "$VENV"
fi

if found=$(check 2>&1); then
  link_checkout
  say "reused: $found ($(( $(date +%s) - started )) s, nothing installed)"
  exit 0
fi
if [ -x "$PY" ]; then
  say "$VENV is present but fails the check, repairing it: $found"
else
  say "creating $VENV with $($BASE_PYTHON --version 2>&1)"
  mkdir -p "$(dirname "$VENV")"
  "$BASE_PYTHON" -m venv "$VENV"
fi
# pip, less the warnings this machine's pip.conf gives for local indexes lacking a package
"$PY" -m pip --disable-pip-version-check install -q "$SPEC" 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }
if ! found=$(check 2>&1); then
  printf '%s\n' "$found" >&2
  say "FAILED: the venv does not pass its check (above)"
  exit 1
fi
link_checkout
say "installed: $found; $(du -sm "$VENV" | cut -f1) MB; $(( $(date +%s) - started )) s"

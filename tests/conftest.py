"""The test tiers as markers (docs/design.md, "Test tiers"): a test's folder is its tier, and
every test gets exactly one.

- ``unit/``: the package's functions in this process (pure functions, parsers, files in a
  temporary directory); ``pytest -m unit`` is the quick loop while editing;
- ``integration/``: starts local processes of its own (agents, the simulated server and
  nodes, Locust, the command line), or works at length in this one (a fit, a simulation of
  error rates, property checks or figures over whole runs: seconds each);
- ``e2e/``: whole-workflow runs on the simulated cluster;
- ``real/``: real components the tests start themselves (sshd, Docker, SLURM, vLLM, Chromium).

What tests share is in ``support/`` (no test module imports another), their fixed inputs in
``data/``. ``pytest -m unit`` (any ``-m`` expression) does not even import a folder whose tier
it leaves out, so the quick loop pays for the collection of its own files only."""

from pathlib import Path

import pytest

from support import cores, fleet

TESTS = Path(__file__).parent
TIERS = ("unit", "integration", "e2e", "real")


def tier_of(path: Path) -> str | None:
    """The tier of a file or folder under tests/: the tier folder it lies in, if any."""
    if not path.is_relative_to(TESTS) or path == TESTS:
        return None
    top = path.relative_to(TESTS).parts[0]
    return top if top in TIERS else None


def pytest_ignore_collect(collection_path, config):
    """A tier's folder, left out by ``-m``, is not imported at all."""
    tier = tier_of(collection_path)
    if tier is None or not config.option.markexpr:
        return None
    try:
        from _pytest.mark.expression import Expression

        selected = Expression.compile(config.option.markexpr).evaluate(lambda name, **_kwargs: name == tier)
    except Exception:  # pytest's expression API is its own: where it changed, collect as before
        return None
    return True if not selected else None


# What tests share beyond their own tmp_path and fixtures, so that they run one after another
# in one xdist worker: a lane. A whole simulated run measures step cadence, wake-ups and
# stall gaps in real time, so whole runs do not crowd the cores: they keep to lanes, each
# module in one (for the cores alone: every run's cluster is on free ports of its own,
# support/ports.py, and its endpoint's lease refuses any other run there; a simulated node's
# spin is accounted, not burnt, so two runs do not read each other's CPU). A run whose host is
# this machine itself (no root: the real vLLM, and ssh to 127.0.0.1) takes the machine's one
# lease (/tmp/thermab-lease), and the real vLLM loads both cores and shares its tiny model
# and venv: those take turns in a lane of their own, which the levels run and the
# until-decided run join, so that the three lanes end together (their times:
# docs/benchmarks.md). An e2e module not named here joins the first lane.
WHOLE_RUNS = ("whole-runs-1", "whole-runs-2")
THIS_MACHINE = "this-machine"
LANES = {*WHOLE_RUNS, THIS_MACHINE}
SHARED = {
    "e2e/test_e2e_sim.py": WHOLE_RUNS[0],
    "e2e/test_fleet.py": WHOLE_RUNS[0],
    "real/test_slurm.py": WHOLE_RUNS[0],  # the fleet's run through SLURM, beside local_fleet's
    "e2e/test_fail_safe.py": WHOLE_RUNS[1],
    "e2e/test_sim_calibration.py": WHOLE_RUNS[1],
    "e2e/test_faults.py": WHOLE_RUNS[1],
    "e2e/test_tune_sim.py": WHOLE_RUNS[1],
    "real/test_vllm_cpu.py": THIS_MACHINE,
    "real/test_load_tools.py": THIS_MACHINE,
    "real/test_ssh.py": THIS_MACHINE,
    "real/test_docker.py": THIS_MACHINE,
    "integration/test_discover.py": THIS_MACHINE,
    "e2e/test_sim_levels.py": THIS_MACHINE,
    "e2e/test_until_decided_sim.py": THIS_MACHINE,
}


def xdist_groups(items) -> dict:
    """Each test's xdist group: the tests that share a module or session fixture (one made
    per worker, so made once only if they run in one) or something of SHARED are one group;
    a test that shares nothing has none and runs wherever a worker is free."""
    parent: dict[str, str] = {}

    def root(key):
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    keys_of = {}
    for item in items:
        name = item.path.relative_to(TESTS).as_posix()
        info = getattr(item, "_fixtureinfo", None)
        keys = {SHARED[name]} if name in SHARED else set()
        if not keys and tier_of(item.path) == "e2e":
            keys.add(WHOLE_RUNS[0])
        for fixture, definitions in (info.name2fixturedefs if info else {}).items():
            own, scope = definitions[-1].baseid, definitions[-1].scope  # a plugin's (tmp_path_factory) has no baseid
            if own and scope in ("session", "module"):
                keys.add(SHARED.get(f"{name}::{fixture}", fixture if scope == "session" else f"{name}::{fixture}"))
        keys_of[item] = keys
        roots = {root(key) for key in keys}
        anchor = min(roots & LANES or roots, default=None)  # a lane names the group it is in
        for found in roots:
            parent[found] = anchor
    return {item: root(min(keys)) for item, keys in keys_of.items() if keys}


@pytest.hookimpl(optionalhook=True)  # xdist's hook
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject's addopts): a worker for each lane (the two of whole runs and
    the one of this machine's own runs), and two that share the rest of the suite
    (docs/benchmarks.md); ``-m unit`` in this process, where several workers' collections
    cost more CPU than the tests."""
    return 0 if config.option.markexpr == "unit" else len(LANES) + 2


def pytest_configure(config):
    """A test file outside the tiers' folders has no tier: the run stops at once naming it
    (here, before xdist's workers collect, so in one line)."""
    outside = sorted(str(path.relative_to(TESTS.parent)) for path in TESTS.rglob("test_*.py") if tier_of(path) is None)
    if outside:
        raise pytest.UsageError(
            f"{', '.join(outside)}: a test file lies in the folder of its tier, one of tests/{{{','.join(TIERS)}}}/"
        )


# The measurements held to the study's numbers have the cores to themselves (support/cores.py):
# the real vLLM's AB run, and the default simulated run that the calibration compares with the
# study's published heat (its tests read that run: the fixture's name below). They come first
# in their lanes, one after the other, while the light tiers run; the whole runs wait for them.
ALONE = {"real/test_vllm_cpu.py": None, "e2e/test_sim_calibration.py": "default_run"}
# Discover's AB run on the real vLLM is a whole run too: beside the others, never beside those
# alone (it loads both cores).
WHOLE_RUN_TESTS = {"integration/test_discover.py::test_vllm_cpu_discover_check_dry_run_and_an_ab_run"}


def _module(item) -> str:
    return item.path.relative_to(TESTS).as_posix()


def _alone(item) -> bool:
    module = _module(item)
    return module in ALONE and (ALONE[module] is None or ALONE[module] in item.fixturenames)


def _whole_run(item) -> bool:
    return (
        tier_of(item.path) == "e2e"
        or SHARED.get(_module(item)) in WHOLE_RUNS
        or f"{_module(item)}::{item.name}" in WHOLE_RUN_TESTS
    )


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(getattr(pytest.mark, tier_of(item.path)))
    for item, group in xdist_groups(items).items():
        item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: not _alone(item))  # stable: the rest keep their order


_cores_alone = cores.Alone()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test of a whole run (e2e, the fleet through SLURM, discover's real-vLLM run; a
    module's run is made in the setup of its first test) shares the cores; the measurements
    of ``ALONE`` hold them alone from their first test to their last."""
    if _alone(item):
        _cores_alone.take()
        try:
            yield
        finally:
            if nextitem is None or not _alone(nextitem):
                _cores_alone.give_back()
    elif _whole_run(item):
        with cores.shared():
            yield
    else:
        yield


@pytest.fixture(scope="session")
def local_fleet(tmp_path_factory):
    """The short simulated fleet, run locally once a session: e2e/test_fleet.py checks it and
    the SLURM tier compares its own run through the profile with it (one local run, not two)."""
    return fleet.run_local(tmp_path_factory.mktemp("fleet"))

"""One tree of errors: every exception class of the package stands under ThermabError, in
the branch its failure belongs to, and the job glue answers each the same way."""

import importlib
import inspect
import pkgutil

import pytest

import thermab
from thermab import errors, jobs
from thermab.errors import HostError, StageFailed, ThermabError, UserError

# outside the tree on purpose (thermab/errors.py says why)
OUTSIDE = {
    "thermab.telemetry.agent.SettingsError",
    "thermab.telemetry.agent.MatchTimeout",
    "thermab.sim.vllm.ApiError",
    "thermab.sim.vllm.EngineGone",
}
BRANCHES = {
    "thermab.errors.UserError": UserError,
    "thermab.config.problems.ConfigError": UserError,
    "thermab.experiment.discover.refusals.UsageError": UserError,
    "thermab.experiment.discover.refusals.Question": UserError,
    "thermab.hosts.transport.TransportError": HostError,
    "thermab.hosts.transport.CommandError": HostError,
    "thermab.hosts.transport.NotAFile": HostError,
    "thermab.hosts.ssh.RefusedError": HostError,
    "thermab.hosts.known_hosts.HostKeyError": HostError,
    "thermab.experiment.patch.PatchError": HostError,
    "thermab.telemetry.deploy.AgentError": HostError,
    "thermab.load.stream.StreamFailure": HostError,
    "thermab.telemetry.server_metrics.ScrapeError": HostError,
    "thermab.telemetry.wall_meters.MeterError": HostError,
    "thermab.sim.node.StartFailed": HostError,
    "thermab.experiment.preflight.PreflightError": StageFailed,
    "thermab.experiment.lease.LeaseError": StageFailed,
    "thermab.experiment.server.NotReady": StageFailed,
    "thermab.experiment.server.EndpointTaken": StageFailed,
    "thermab.load.runner.LoadAborted": StageFailed,
}


def package_exceptions() -> dict[str, type]:
    found = {}
    for module_info in pkgutil.walk_packages(thermab.__path__, "thermab."):
        # the locustfile is Locust's to import (it monkey-patches the whole process with gevent)
        if module_info.name.endswith("__main__") or module_info.name == "thermab.load.locustfile":
            continue
        module = importlib.import_module(module_info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = value
    return found


def test_every_exception_class_is_in_its_branch():
    classes = package_exceptions()
    assert set(classes) - {
        "thermab.errors.ThermabError",
        "thermab.errors.HostError",
        "thermab.errors.StageFailed",
    } - OUTSIDE == set(BRANCHES)
    for name, branch in BRANCHES.items():
        assert issubclass(classes[name], branch), name
    for name in OUTSIDE:
        assert not issubclass(classes[name], ThermabError), name


def test_the_errors_keep_their_builtin_bases():
    assert issubclass(HostError, RuntimeError) and issubclass(StageFailed, RuntimeError)
    assert errors.exit_status(UserError("x")) == 2 and errors.exit_status(StageFailed("x")) == 1


@pytest.mark.parametrize(
    "error, status",
    [
        (StageFailed("phase rep1-A failed: 3 of 9 load requests failed"), 1),
        (UserError("config key 'order': 'AA' names an arm twice"), 2),
    ],
)
def test_a_job_prints_the_message_once_without_a_traceback(tmp_path, capsys, error, status):
    log = tmp_path / "job.log"
    with pytest.raises(SystemExit) as exited:
        with jobs.logged(str(log)):
            raise error
    assert exited.value.code == status
    assert log.read_text() == f"{error}\n"


def test_a_bug_keeps_its_traceback(tmp_path):
    log = tmp_path / "job.log"
    with pytest.raises(SystemExit):
        with jobs.logged(str(log)):
            raise KeyError("a bug")
    assert "Traceback" in log.read_text()

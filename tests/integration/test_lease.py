"""Two runs against the same hosts or endpoint: the first holds a lease on each host and on
its endpoint from its preflight until it puts the hosts back; the second is refused at
preflight naming the holder, changing nothing; the same run comes back in; a lease outliving
its run is broken on purpose, and a damaged one is named in one line; a server that no run
of the cluster started, answering on its endpoint, is refused before a server is started.
Simulated hosts on this machine (transport local), real processes."""

import dataclasses
import getpass
import hashlib
import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from support.command_line import run_thermab
from support.paths import REPO
from support.ports import free_ports
from support.processes import wait_until
from support.sim_runs import own_ports
from thermab.config import validate, view
from thermab.errors import UserError, exit_status
from thermab.experiment import guardian, lease, lease_command, preflight, server
from thermab.experiment.cluster import ClusterRun


@pytest.fixture
def ports():
    """Closed ports of this machine for the head's server (the endpoint) and the worker's;
    the endpoint's lease, outside every test's directory as every run's is, does not outlive
    the test."""
    head, worker = free_ports(2)
    yield head, worker
    shutil.rmtree(f"{lease.ENDPOINT_LEASE}{head}", ignore_errors=True)


@pytest.fixture
def port(ports):
    return ports[0]


@pytest.fixture
def config(tmp_path, monkeypatch, ports):
    """The default study's two simulated nodes under tmp_path, their servers on closed ports."""
    monkeypatch.chdir(tmp_path)
    raw = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cluster = own_ports(*ports)["sim"]
    raw["clusters"]["sim"]["endpoint"] = cluster["endpoint"]
    for name, host in cluster["hosts"].items():
        raw["clusters"]["sim"]["hosts"][name]["server"].update(host["server"])
    return validate(raw)


def run_of(config, tmp_path: Path, order: str) -> ClusterRun:
    return ClusterRun(view(config), "sim", order, tmp_path / "results/sim" / order, tmp_path, progress=lambda _m: None)


def do_preflight(run: ClusterRun):
    return preflight.preflight(run, run.files.preflight, run.files.run_json)


def nodes(tmp_path: Path) -> dict[str, str]:
    """Every file and directory of the simulated nodes, with its content's digest."""
    root = tmp_path / ".thermab"
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
        if not p.is_symlink()
    }


def leases(run: ClusterRun) -> dict[str, lease.Lease]:
    """Each host's lease and the endpoint's, by the name a refusal gives them."""
    return {site.name: lease.read(site) for site in run.lease_sites}


def host_lease(host) -> lease.Lease:
    return lease.read(lease.host_site(host))


def refused(run: ClusterRun) -> str:
    with pytest.raises(lease.LeaseError) as caught:
        do_preflight(run)
    return str(caught.value)


def test_a_second_run_is_refused_at_preflight_naming_the_holder_and_changing_nothing(config, tmp_path, port):
    first, second = run_of(config, tmp_path, "AB"), run_of(config, tmp_path, "BA")
    do_preflight(first)
    before = nodes(tmp_path)
    line = refused(second)
    assert "\n" not in line
    holder = host_lease(first.head).holder
    assert holder.run_id == lease.run_id(first.run_dir) and holder.run_dir == str(first.run_dir.resolve())
    for named in (
        f"refused: hosts worker, head, endpoint 127.0.0.1:{port}: held by",
        f"{getpass.getuser()}@{socket.gethostname()} since {holder.since}",
        f"run {first.run_dir.resolve()} (id {holder.run_id}, controller pid {holder.pid}",
        f"`python -m thermab lease {second.run_dir} --break`",
        "nothing was changed",
    ):
        assert named in line, (named, line)
    assert holder.since.endswith("Z") and holder.since[:4].isdigit()
    assert nodes(tmp_path) == before, "nothing changed on any host"
    assert not second.files.preflight.exists() and not second.files.run_json.exists()
    assert exit_status(lease.LeaseError(line)) == exit_status(preflight.PreflightError("")), "as preflight's refusals"
    # a job of the second run that brings hosts up is refused the same way
    with pytest.raises(lease.LeaseError, match=f"hosts worker, head, endpoint 127.0.0.1:{port}: held by"):
        lease.hold(second.lease_sites, second.run_dir)
    assert {name: found.holder.run_id for name, found in leases(first).items()} == {
        "worker": holder.run_id,
        "head": holder.run_id,
        f"endpoint 127.0.0.1:{port}": holder.run_id,
    }


def test_one_host_refused_gives_back_the_others_this_run_took(config, tmp_path):
    first, second = run_of(config, tmp_path, "AB"), run_of(config, tmp_path, "BA")
    lease.take_all([lease.host_site(first.head)], first.run_dir)
    line = refused(second)
    assert line.startswith("refused: host head: held by ") and "worker" not in line and "endpoint" not in line
    assert host_lease(second.hosts[0]).free, "the worker's lease, taken by the second run, given back"
    assert leases(second)[second.lease_sites[-1].name].free, "and the endpoint's"
    assert host_lease(first.head).holder.run_id == lease.run_id(first.run_dir)


def test_a_run_elsewhere_on_the_same_endpoint_is_refused_naming_the_holder(config, tmp_path, port):
    """Other hosts (their own roots), the same port by another name of the address: the
    endpoint alone refuses."""
    first = run_of(config, tmp_path, "AB")  # a view: it copies the config
    config["clusters"]["sim"]["hosts"]["worker"]["root"] = ".thermab/elsewhere/worker"
    config["clusters"]["sim"]["hosts"]["head"]["root"] = ".thermab/elsewhere/head"
    config["clusters"]["sim"]["endpoint"] = f"http://localhost:{port}"
    elsewhere = run_of(config, tmp_path, "BA")
    assert not {site.path for site in first.lease_sites[:2]} & {site.path for site in elsewhere.lease_sites[:2]}
    do_preflight(first)
    line = refused(elsewhere)
    holder = host_lease(first.head).holder
    assert line.startswith(f"refused: endpoint localhost:{port}: held by "), "its hosts are its own"
    assert f"run {first.run_dir.resolve()} (id {holder.run_id}, controller pid {holder.pid}" in line
    assert exit_status(lease.LeaseError(line)) == 1, "another run's hold is a conflict, not the user's input"
    assert all(host_lease(host).free for host in elsewhere.hosts), "the hosts it took given back"
    first.shutdown("completed")
    assert all(found.free for found in leases(first).values())
    do_preflight(elsewhere)  # let in once the first run is over
    assert leases(elsewhere)[f"endpoint localhost:{port}"].holder.run_id == lease.run_id(elsewhere.run_dir)


def test_the_run_restarts_its_own_server_on_its_endpoint_and_gives_the_endpoint_back(config, tmp_path):
    run = run_of(config, tmp_path, "AB")
    do_preflight(run)
    try:
        for _ in range(2):  # each phase stops the server of the one before and starts its own
            server.restart_servers(run.hosts, run.cluster)
            assert server.wait_ready(run.cluster.endpoint, 60, progress=lambda _m: None) == "sim-deepseek"
    finally:
        run.shutdown("completed")
    assert not server.answers(run.cluster.endpoint), "its server stopped at the end"
    assert all(found.free for found in leases(run).values())


@pytest.fixture
def squatter(port):
    """Something that is no server of the cluster, listening on its endpoint's port."""
    with socket.create_server(("127.0.0.1", port)) as listening:
        yield listening


def test_something_else_answering_on_the_endpoint_is_refused_before_a_server_starts(config, tmp_path, port, squatter):
    run = run_of(config, tmp_path, "AB")
    do_preflight(run)  # a server may answer before the first phase: the cluster's own, to be restarted
    with pytest.raises(server.EndpointTaken) as caught:
        server.restart_servers(run.hosts, run.cluster)
    line = str(caught.value)
    assert "\n" not in line and line.startswith(f"endpoint 127.0.0.1:{port}: something answers there after ")
    assert "config key 'clusters.sim.endpoint'" in line
    assert exit_status(caught.value) == 1, "what a host does, not what the user gave"
    problems = run.shutdown("failed")
    assert problems == [], problems
    assert all(found.free for found in leases(run).values()), "a failed run gives its leases back"
    squatter.close()
    assert not server.answers(run.cluster.endpoint), "no server of the run was started"


def test_the_same_run_comes_back_in_and_its_record_names_the_controller_now(config, tmp_path):
    run = run_of(config, tmp_path, "AB")
    do_preflight(run)
    first = host_lease(run.head).holder
    assert lease.take_all(run.lease_sites, run.run_dir) == ([], {}), "a preflight again: held already"
    lease.hold(run.lease_sites, run.run_dir)  # a later job of the run
    assert host_lease(run.head).holder == first
    later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # the next invocation (a Snakemake rerun) under another controller
        taken, unreached = lease.take_all(run.lease_sites, run.run_dir, controller_pid=later.pid)
    finally:
        later.kill()
        later.wait()
    assert (taken, unreached) == ([], {}), "held already: nothing taken anew"
    for again in (found.holder for found in leases(run).values()):
        assert (again.pid, again.since, again.run_id) == (later.pid, first.since, first.run_id)


def test_the_end_of_the_run_gives_the_leases_back(config, tmp_path):
    run = run_of(config, tmp_path, "AB")
    do_preflight(run)
    assert not any(found.free for found in leases(run).values())
    run.shutdown("completed")
    assert all(found.free for found in leases(run).values())
    following = run_of(config, tmp_path, "BA")
    assert lease.take_all(following.lease_sites, following.run_dir)[0] == following.lease_sites, (
        "the next run is let in"
    )


def test_a_failed_preflight_gives_back_what_it_took(config, tmp_path):
    config["setting"]["anchor"] = "no such anchor in the file"
    run = run_of(config, tmp_path, "AB")
    with pytest.raises(preflight.PreflightError, match="anchor"):
        do_preflight(run)
    assert all(found.free for found in leases(run).values())


def test_the_guardian_gives_the_leases_back_when_the_controller_dies(config, tmp_path):
    run = run_of(config, tmp_path, "AB")
    run.write_session()
    lease.take_all(run.lease_sites, run.run_dir)
    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watcher = guardian.ensure(run.run_dir, watch=controller.pid)
    finally:
        controller.kill()
        controller.wait()
    assert wait_until(lambda: not guardian.alive(watcher), timeout=60)
    assert all(found.free for found in leases(run).values()), run.files.log("guardian.log").read_text()


def test_giving_back_leaves_another_runs_lease_alone(config, tmp_path):
    first, second = run_of(config, tmp_path, "AB"), run_of(config, tmp_path, "BA")
    lease.take_all(first.lease_sites, first.run_dir)
    assert lease.give_back(second.lease_sites, lease.run_id(second.run_dir)) == []
    assert lease.give_back(second.lease_sites, lease.run_id(tmp_path / "never-ran", create=False)) == []
    assert all(found.holder.run_id == lease.run_id(first.run_dir) for found in leases(first).values())


def test_a_stale_lease_is_named_and_broken_only_on_purpose(config, tmp_path, port):
    first, second = run_of(config, tmp_path, "AB"), run_of(config, tmp_path, "BA")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    first.write_session()
    lease.take_all(first.lease_sites, first.run_dir, controller_pid=gone.pid)
    line = refused(second)
    assert f"controller pid {gone.pid}, gone from {socket.gethostname()}: stale" in line
    assert not any(found.free for found in leases(first).values()), "reported, never taken over"

    status = run_thermab("lease", second.run_dir, cwd=tmp_path)
    assert status.returncode == 0 and status.stderr == "", status.stderr
    for name in ("worker", "head", f"endpoint 127.0.0.1:{port}"):
        assert (
            f"{name}: held by {getpass.getuser()}@" in status.stdout and str(first.run_dir.resolve()) in status.stdout
        )
    assert not any(found.free for found in leases(first).values()), "the status changes nothing"
    mine = run_thermab("lease", first.run_dir, cwd=tmp_path)
    assert mine.stdout.count("(this run)") == 3

    broken = run_thermab("lease", second.run_dir, "--break", cwd=tmp_path)
    assert broken.returncode == 0, broken.stderr
    assert broken.stdout.count("broke the lease, held by") == 3
    assert all(found.free for found in leases(first).values())
    assert lease.take_all(second.lease_sites, second.run_dir)[0] == second.lease_sites


DAMAGES = {
    "garbage": lambda path: (path.mkdir(), (path / "holder").write_bytes(b"\x00\xff{not json\n" * 50)),
    "empty": lambda path: (path.mkdir(), (path / "holder").write_bytes(b"")),
    "a record without a pid": lambda path: (
        path.mkdir(),
        (path / "holder").write_text(json.dumps({"user": "u", "run_id": "0" * 16})),
    ),
    "a directory as the holder": lambda path: (path.mkdir(), (path / "holder").mkdir()),
    "a file as the lease": lambda path: path.write_text("x"),
    "a lease without a holder": lambda path: path.mkdir(),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_lease_is_one_line_never_a_traceback(config, tmp_path, damage):
    run = run_of(config, tmp_path, "AB")
    path = Path(lease.host_site(run.head).path)
    path.parent.mkdir(parents=True)
    DAMAGES[damage](path)
    line = refused(run)
    assert "\n" not in line and line.startswith(f"refused: host head: damaged: {path}: ")
    assert f"`python -m thermab lease {run.run_dir} --break`" in line
    assert host_lease(run.hosts[0]).free, "the worker's lease given back"

    status = run_thermab("lease", run.run_dir, cwd=tmp_path)
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    assert f"head: damaged: {path}: " in status.stdout and "worker: free" in status.stdout
    broken = run_thermab("lease", run.run_dir, "--break", cwd=tmp_path)
    assert broken.returncode == 0 and f"head: broke the lease, damaged: {path}" in broken.stdout, broken.stderr
    assert not path.exists() and not path.is_symlink()
    assert lease.take_all(run.lease_sites, run.run_dir)[0] == run.lease_sites, "all taken now"


def test_the_lease_command_answers_a_directory_without_a_run_in_one_line(tmp_path):
    result = run_thermab("lease", tmp_path, cwd=tmp_path)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"{tmp_path}: no session.json" in result.stderr
    (tmp_path / "session.json").write_text("{not json")
    result = run_thermab("lease", tmp_path, cwd=tmp_path)
    assert result.returncode == 2 and "session.json: not a session thermab wrote" in result.stderr, result.stderr


def test_a_damaged_run_id_is_one_line_naming_it(tmp_path):
    (tmp_path / "run-id").write_text("not an id\n")
    with pytest.raises(UserError, match=f"{tmp_path / 'run-id'}: not a run id"):
        lease.run_id(tmp_path)


def test_a_run_id_is_made_once(tmp_path):
    made = lease.run_id(tmp_path / "run")
    assert lease.run_id(tmp_path / "run") == made and lease.RUN_ID.fullmatch(made)
    assert lease.run_id(tmp_path / "other", create=False) is None and not (tmp_path / "other").exists()


# a shared machine's two cores may draw slowly: no health check on the speed of the drawing
PROFILE = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HOLDER = lease.Holder("u", "box", "2025-01-01T00:00:00Z", "/r/results/sim/AB", "0123456789abcdef", 42)


@PROFILE
@given(st.binary(max_size=300))
def test_any_bytes_are_a_holder_or_a_reason(data):
    found = lease.parse_holder(data)
    assert isinstance(found, lease.Holder) or (isinstance(found, str) and found.isprintable())


@PROFILE
@given(
    st.dictionaries(
        st.sampled_from(sorted(lease.HOLDER_FIELDS)),
        st.one_of(st.text(max_size=20), st.integers(), st.booleans(), st.none(), st.floats()),
    )
)
def test_a_record_is_a_holder_only_with_every_field_of_its_kind(record):
    found = lease.parse_holder(json.dumps({**dataclasses.asdict(HOLDER), **record}).encode())
    if isinstance(found, lease.Holder):
        assert found.run_id == (record.get("run_id", HOLDER.run_id)) and found.pid > 0
        assert all(
            isinstance(getattr(found, key), kind) and not isinstance(getattr(found, key), bool)
            for key, kind in lease.HOLDER_FIELDS.items()
        )
        assert all(getattr(found, key).isprintable() for key, kind in lease.HOLDER_FIELDS.items() if kind is str)
    else:
        assert any(key in found for key in lease.HOLDER_FIELDS)


def test_a_holder_round_trips():
    assert lease.parse_holder(json.dumps(dataclasses.asdict(HOLDER)).encode()) == HOLDER


def test_the_command_names_the_paths_the_leases_lie_at():
    doc = lease_command.__doc__.replace("\n", " ")
    assert f"{lease.LEASE} on each host" in doc and f"{lease.ENDPOINT_LEASE}PORT on the head host" in doc

"""Server lifecycle on a cluster: stop (head first), start (in config order: the worker
before the head) once nothing answers on the endpoint, and wait until the OpenAI endpoint is
ready."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from thermab.config import ClusterSpec, endpoint_address
from thermab.errors import StageFailed
from thermab.hosts.host import Host

# A stop command that signals its server and returns before the server has let go of its port
# is given this long; a stop that waits (the simulated server's, `docker stop`) needs none of it.
STOP_GRACE_S = 10.0


class NotReady(StageFailed):
    pass


class EndpointTaken(StageFailed):
    """Something this cluster's stop commands did not stop answers on its endpoint."""


def stop_servers(hosts: list[Host]) -> None:
    for host in reversed(hosts):
        command = host.spec.command("stop")
        if command:
            host.run(command, timeout=300)


def start_servers(hosts: list[Host], env: dict[str, str] | None = None) -> None:
    for host in hosts:
        command = host.spec.command("start", env)
        if command:
            host.run(command, timeout=300)


def answers(endpoint: str, timeout_s: float = 2) -> bool:
    """Something accepts a connection at the endpoint's address and port."""
    try:
        with socket.create_connection(endpoint_address(endpoint), timeout=timeout_s):
            return True
    except OSError:
        return False


def restart_servers(hosts: list[Host], cluster: ClusterSpec, env: dict[str, str] | None = None) -> None:
    """Stop the cluster's servers, then start them where nothing answers on the endpoint any
    more: what still answers there is no server of this cluster (another run's, one started
    by hand), and a start would fail on its port or, worse, leave the load to it."""
    stop_servers(hosts)
    deadline = time.monotonic() + STOP_GRACE_S
    while answers(cluster.endpoint):
        if time.monotonic() >= deadline:
            address, port = endpoint_address(cluster.endpoint)
            raise EndpointTaken(
                f"endpoint {address}:{port}: something answers there after the servers of cluster "
                f"{cluster.name} were stopped, so it is no server of this run; stop it, or give the "
                f"cluster a port of its own (config key 'clusters.{cluster.name}.endpoint' and the "
                "hosts' server.start)"
            )
        time.sleep(0.5)
    start_servers(hosts, env)


def _get_json(url: str, timeout: float = 5) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read() or b"{}")


def models(endpoint: str) -> list[str]:
    """The model ids the OpenAI endpoint serves (``/v1/models``)."""
    return [model["id"] for model in _get_json(endpoint + "/v1/models")["data"]]


def wait_ready(endpoint: str, timeout_s: float, *, poll_s: float = 1.0, progress: Callable[[str], None] = print) -> str:
    """Poll ``/health`` then ``/v1/models``; return the first model id.

    Real servers take 3-20 minutes to load weights, so progress is reported while waiting."""
    deadline = time.monotonic() + timeout_s
    last_error = "no answer yet"
    next_report = time.monotonic()
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(endpoint + "/health", timeout=5).close()
            served = models(endpoint)
            if served:
                return served[0]
            last_error = "/v1/models lists no model"
        except (urllib.error.URLError, OSError, KeyError, ValueError) as error:
            last_error = str(getattr(error, "reason", error))
        if time.monotonic() >= next_report:
            waited = timeout_s - (deadline - time.monotonic())
            progress(f"waiting for {endpoint} to be ready: {waited:.0f}/{timeout_s:.0f} s ({last_error})")
            next_report = time.monotonic() + 10
        time.sleep(poll_s)
    raise NotReady(
        f"{endpoint} not ready after {timeout_s:.0f} s (config key 'timings.startup_timeout_s'): {last_error}"
    )

"""Free TCP ports on 127.0.0.1, for the servers a test starts: each run's cluster on ports of
its own, so no test meets another's servers, whatever order or lane runs them."""

import socket
from contextlib import ExitStack
from pathlib import Path

from thermab.experiment.lease import ENDPOINT_LEASE


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: each socket is held until all are bound, so the kernel
    never hands one port out twice; a port whose endpoint lease a killed run left behind is
    passed over, as a run on it would be refused."""
    with ExitStack() as held:
        ports: list[int] = []
        while len(ports) < count:
            sock = held.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            if not Path(f"{ENDPOINT_LEASE}{port}").exists():
                ports.append(port)
        return ports

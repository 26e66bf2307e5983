"""Free TCP ports on 127.0.0.1, for the servers a test starts: each run's cluster on ports of
its own, so no test meets another's servers, whatever order or lane runs them."""

import socket
from contextlib import ExitStack


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: each socket is held until all are bound, so the kernel
    never hands one port out twice."""
    with ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]

"""Pure parsing of ``docker inspect``/``podman inspect``: the containers, their mounts,
labels and environment, and which bind mount holds a path."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Mount:
    kind: str
    source: str
    destination: str
    writable: bool


@dataclass(frozen=True)
class Container:
    engine: str
    name: str
    id: str
    pid: int  # its main process, as this host's /proc numbers it
    image: str
    restart: str
    mounts: tuple[Mount, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


def parse_inspect(engine: str, text: str) -> list[Container]:
    """``docker inspect``/``podman inspect`` JSON -> containers (both engines' shapes)."""
    containers = []
    for item in json.loads(text or "[]"):
        config, state, host_config = item.get("Config") or {}, item.get("State") or {}, item.get("HostConfig") or {}
        mounts = tuple(
            Mount(m.get("Type", ""), m.get("Source", ""), m.get("Destination", ""), bool(m.get("RW", True)))
            for m in item.get("Mounts") or []
        )
        env = tuple(tuple(e.split("=", 1)) for e in config.get("Env") or [] if "=" in e)
        containers.append(
            Container(
                engine,
                str(item.get("Name", "")).lstrip("/"),
                str(item.get("Id", "")),
                int(state.get("Pid") or 0),
                str(config.get("Image", "")),
                str((host_config.get("RestartPolicy") or {}).get("Name") or "no"),
                mounts,
                tuple(sorted((config.get("Labels") or {}).items())),
                env,
            )
        )
    return containers


def bind_mount_of(path: str, mounts: tuple[Mount, ...]) -> tuple[Mount, str] | None:
    """The bind mount holding ``path`` (a path inside the container) and the path on the host."""
    for mount in sorted(mounts, key=lambda m: -len(m.destination)):
        if mount.kind == "bind" and (path == mount.destination or path.startswith(mount.destination.rstrip("/") + "/")):
            return mount, mount.source + path[len(mount.destination.rstrip("/")) :]
    return None

"""Check config files before a run: valid, and fit for the hosts they name.

    python -m thermab check-config FILE [FILE ...] [--hosts]

Several files are layered as snakemake --configfile layers them: a later file's mappings
merge into the earlier ones key by key, any other value replaces the earlier one. Each
problem is listed once, in one line naming the key (exit status 2).

Without a host reached it also checks, for every SSH host, that its key_file exists and is
readable and that a known_hosts file it reads holds a key for it (unless host_key_policy is
accept-new, which pins the key on first contact).

--hosts reaches every host as a run's preflight does and reports, per host, what a run
needs: SSH, the container, the agent's Python, the setting's file and its anchor, the
thermal zones and their trip points, the power counters and whether they are readable, the
vLLM processes, and whether the endpoint answers. It changes nothing on any host: a file an
earlier run left patched is named, not restored, and the agent's discovery runs from its
stdin, writing nothing (a simulated node's files are built on this machine, as a run builds
them). Exit status 1 when a host is not fit for a run, naming each problem.
"""

from __future__ import annotations

import os
from pathlib import Path

from thermab import cli, config as thermab_config, layout
from thermab.config import ConfigError, HostSpec
from thermab.errors import StageFailed
from thermab.experiment import preflight
from thermab.experiment.cluster import ClusterRun
from thermab.hosts import known_hosts


def _known_hosts_problem(spec: HostSpec, files: list[Path], address: str, port: int) -> str | None:
    """Why no key in ``files`` would let a strict connection to ``address``:``port``
    through, or None where one is there."""
    name = known_hosts.host_name(address, port)
    if any(entry.marker != known_hosts.REVOKED for entry in known_hosts.KnownHosts(files).for_host(name)):
        return None
    return (
        f"host {spec.name} ({spec.cluster}): no known_hosts entry for {name} in "
        f"{' or '.join(map(str, files))}; add one (ssh-keyscan -p {port} {address} >> FILE, after checking "
        "its fingerprint) or set host_key_policy: accept-new"
    )


def local_problems(config: thermab_config.Config) -> list[str]:
    """What can be told wrong without reaching a host: each SSH host's key file and its
    pinned host key (the jump host's too)."""
    from thermab.hosts.ssh import SshTransport, parse_target  # paramiko: only for configs with SSH hosts

    problems = []
    for cluster in config.clusters:
        for spec in thermab_config.cluster_spec(config, cluster).hosts:
            if spec.transport != "ssh":
                continue
            settings = spec.settings
            key_file = settings.get("key_file")
            if key_file and not os.access(os.path.expanduser(key_file), os.R_OK):
                exists = os.path.exists(os.path.expanduser(key_file))
                problems.append(
                    f"config key 'clusters.{cluster}.hosts.{spec.name}.key_file': {key_file} "
                    + ("is not readable by this user" if exists else "does not exist")
                )
            if settings.get("host_key_policy", "strict") != "strict":
                continue
            files = SshTransport.from_spec(spec).read_files
            targets = [(settings["address"], settings.get("port", 22))]
            if settings.get("jump"):
                targets.insert(0, parse_target(settings["jump"])[1:])
            problems += [p for target in targets if (p := _known_hosts_problem(spec, files, *target))]
    return list(dict.fromkeys(problems))  # hosts behind one jump host share its problem


def power_line(power: dict) -> str:
    """The power sources a host's agent found, and any counter it cannot read."""
    if not power:
        return "none found (no energy per token from this host)"
    parts = []
    for name, found in power.items():
        details = found.get("details") or []
        unreadable = [d["domain"] for d in details if d.get("readable") is False]
        readable = [d["domain"] for d in details if d.get("readable") is not False]
        if unreadable:
            parts.append(
                f"{name}: {', '.join(readable) or 'nothing'} readable; NOT READABLE by this user: "
                f"{', '.join(unreadable)} (most kernels make RAPL counters root-only)"
            )
        else:
            listed = readable or found.get("domains") or found.get("sensors") or []
            parts.append(f"{name}: {', '.join(map(str, listed)) or 'available'}")
    return "; ".join(parts)


def check_hosts(config: thermab_config.Config, workdir: Path) -> list[str]:
    """Every host of every cluster reached as a run's preflight reaches it, changing
    nothing; what each offers is printed; the problems that would stop a run returned."""
    problems = []
    for cluster in config.clusters:
        print(f"cluster {cluster}:")
        run = ClusterRun(
            config,
            cluster,
            config.order,
            layout.run_dir(cluster, config.order).path,
            workdir,
            lambda message: print(f"  {message}", flush=True),
        )
        report, found = preflight.inspect(run, change=False)
        for name, facts in report.hosts.items():
            if facts.get("reachable"):
                spec = run.cluster.host(name)
                where = f"in container {spec.container} ({spec.container_engine})" if spec.container else "on the host"
                vllm = (
                    "simulated node"
                    if spec.simulated
                    else f"vLLM {where}: {facts.get('vllm_version') or 'does not import'}"
                )
                print(f"  {name}: reached ({facts.get('uname', '')}); {vllm}")
                print(f"  {name}: power: {power_line(facts.get('power') or {})}")
        model = report.endpoint.get("model")
        print(f"  endpoint {run.cluster.endpoint}: " + (f"serves {model}" if model else "does not answer now"))
        problems += found
    return problems


def main(argv: list[str]) -> int:
    parser = cli.parser("check-config", __doc__)
    parser.add_argument("configs", nargs="+", metavar="FILE", help="config files, later ones layered over earlier")
    parser.add_argument("--hosts", action="store_true", help="also reach every host (changing nothing)")
    args = parser.parse_args(argv)
    config = thermab_config.view(thermab_config.load(args.configs))
    named = " + ".join(args.configs)
    problems = local_problems(config)
    if problems:
        count = f"{len(problems)} problems: " if len(problems) > 1 else ""
        raise ConfigError(f"{named}: {count}" + "; ".join(problems))
    print(
        f"{named}: valid ({', '.join(config.clusters)}; order {config.order}, {config.repeats} repeat(s))",
        flush=True,
    )
    if not args.hosts:
        return 0
    problems = check_hosts(config, Path.cwd())
    if problems:
        raise StageFailed(f"not fit for a run ({len(problems)} problem(s)):\n  " + "\n  ".join(problems))
    print("every host is fit for a run")
    return 0

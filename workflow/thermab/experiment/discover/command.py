"""Point it at real nodes, get a checked config.

    python -m thermab discover NAME=URL [NAME=URL ...] [--head NAME] [--jump USER@HOST:PORT]
        [--key-file FILE] [--known-hosts FILE] [--container [HOST=]NAME|auto|none]
        [--endpoint URL] [--cluster NAME] [--setting-from CONFIG] [-o FILE]

URL is ssh://[user@]host[:port] (the transport of a run, host keys pinned in
--known-hosts) or local:// (this machine). Nothing on a host changes: every command only
reads (/proc, docker or podman ps and inspect, the setting's file, import vllm with -B so no
bytecode is written), and the agent's own discovery reaches the host's Python on its stdin.

Per host it finds the running vLLM server (on the host or in a container), the Python that
imports vllm and its version, the setting's file with its anchor count and current value,
the serve command line, thermal zones with trip points, cpufreq policies, GPUs, whatever
else the agent's sources report (power, ...), the clock offset, and whether /v1/models
answers. It prints each fact with its source, and what it could not find with why; then
writes a commented config (to -o FILE, else stdout) with the lifecycle preset that fits,
which passes check-config.

Exit 2: a user error, or a choice only the user can make (several servers or containers:
the message names them and the flag that picks one). Exit 1: something a run needs is
missing (the table says what); nothing is written. Exit 0: the config is written.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shlex
import sys
from pathlib import Path

from thermab import cli, config as thermab_config
from thermab.config import endpoint_problem, redact_url
from thermab.experiment.discover.facts import render_table
from thermab.experiment.discover.host_setting import load_setting
from thermab.experiment.discover.presets import Place, choose_preset, replayed_env
from thermab.experiment.discover.probe import HostProbe, check_endpoint, host_spec
from thermab.experiment.discover.refusals import Question, UsageError
from thermab.experiment.discover.render import CLUSTER, HostPlan, build_config, render_yaml
from thermab.experiment.discover.servers import Server, choose_server, pick_head
from thermab.experiment.discover.targets import check_jump, parse_containers, parse_target
from thermab.hosts.host import Host
from thermab.hosts.transport import TransportError


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = cli.parser("discover", __doc__)
    parser.add_argument("hosts", nargs="+", metavar="NAME=URL", help="ssh://[user@]host[:port] or local://")
    parser.add_argument(
        "--head",
        help="the host serving the API (default: the one named head, or the one server not started --headless)",
    )
    parser.add_argument("--jump", help="jump host for every SSH host, user@host:port")
    parser.add_argument("--key-file", help="private key for SSH (default: the ssh-agent)")
    parser.add_argument("--known-hosts", help="pinned host keys (default: ~/.ssh/known_hosts)")
    parser.add_argument(
        "--container",
        action="append",
        default=[],
        metavar="[HOST=]NAME|auto|none",
        help="which container's server to measure (auto: the only one; none: a server outside "
        "containers); repeat with HOST= per host",
    )
    parser.add_argument(
        "--endpoint",
        help="the OpenAI base URL (default: the head's address and its server's "
        "--port); its port also picks the head's server among several",
    )
    parser.add_argument("--cluster", default=CLUSTER, help="the cluster's name in the config")
    parser.add_argument(
        "--setting-from",
        type=Path,
        help="the config whose setting and arms to use (default: the study's, as config/config.yaml states them)",
    )
    parser.add_argument("-o", "--output", type=Path, help="write the config here (default: stdout)")
    return parser.parse_args(argv)


def survey(
    args: argparse.Namespace, probes: dict[str, HostProbe], setting: dict, arms: dict
) -> tuple[list[str], str | None]:
    """Read every host; returns the questions for the user and the config's text, None
    unless a run could use it (the probes hold what was found and what was not)."""
    targets = [probe.target for probe in probes.values()]
    endpoint_port = None
    if args.endpoint:
        match = re.match(r"^https?://[^/:]+:(\d+)", args.endpoint)
        endpoint_port = int(match.group(1)) if match else (443 if args.endpoint.startswith("https") else 80)
    questions: list[str] = []
    chosen: dict[str, Server] = {}
    for target in targets:
        probe = probes[target.name]
        probe.note("reached", target.url, "SSH, host key pinned" if target.transport == "ssh" else "this machine")
        servers = probe.servers()
        try:
            server = choose_server(target.name, servers, args.choices[target.name], endpoint_port)
        except Question as question:
            questions.append(str(question))
            continue
        if server is None and servers:
            probe.lack(
                "vLLM server",
                f"none matches --container {args.choices[target.name]}: " + "; ".join(s.label for s in servers),
            )
        if server is not None:
            chosen[target.name] = server
    if questions or len(chosen) != len(targets):
        return questions, None
    try:
        head = pick_head([t.name for t in targets], chosen, args.head)
    except Question as question:
        return [str(question)], None
    plans = []
    for target in targets:
        probe, server = probes[target.name], chosen[target.name]
        probe.note("serve command", server.process.command, f"/proc/{server.process.pid}/cmdline")
        place = probe.place(server)
        cwd, environ = probe.view(server)
        found = probe.vllm(server, place, cwd)
        located = probe.setting_file(place, found[2] if found else None, setting)
        zones = probe.agent()
        gpus = probe.gpus()
        probe.clock()
        if located is None:
            continue
        inherited = dict(server.container.env) if server.container else {}
        preset = choose_preset(
            Place(
                server,
                located[0],
                cwd,
                tuple(replayed_env(environ, inherited).items()),
                probe.systemd_unit(server),
                f"/tmp/thermab-{args.cluster}-{target.name}-server.log",
            )
        )
        probe.note("preset", preset.name, "chosen: " + preset.reason)
        # the Python matters where thermab patches inside the server's filesystem
        python = found[0] if found and preset.file == located[0] else None
        plans.append(HostPlan(target, preset, python, located[1], zones, gpus))
    if len(plans) != len(targets):
        return [], None
    endpoint, model = check_endpoint(probes[head], chosen[head], args.endpoint)
    stock, source = next(iter(arms.values()))["value"], args.setting_from or "the study's setting"
    for plan in plans:
        if plan.value is not None and plan.value != stock:
            probes[plan.target.name].lack(
                "stock value",
                f"{setting['name']} is {plan.value} here, not {stock} as in {source}: "
                f"a patch left behind? The reference arm takes {plan.value}",
            )
    try:
        config, comments = build_config(plans, head, endpoint, model, setting, arms, args.option_values, args.cluster)
    except Question as question:
        return [str(question)], None
    thermab_config.validate(config)  # what is written passes check-config, or this is a bug
    header = (
        f"Written by: thermab discover {shlex.join(args.argv)}\n"
        "Every value was found on the hosts (the table printed beside it gives each one's source)\n"
        "or is the study's default; only the arm values are yours to choose (TODO). Then:\n"
        "  python -m thermab check-config FILE\n"
        "  snakemake --cores 1 all --configfile FILE"
    )
    return [], render_yaml(config, comments, header)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    args.argv = argv
    args.option_values = {"key_file": args.key_file, "known_hosts": args.known_hosts, "jump": args.jump}
    probes: dict[str, HostProbe] = {}
    try:
        targets = [parse_target(text) for text in args.hosts]
        names = [t.name for t in targets]
        if len(set(names)) != len(names):
            raise UsageError(f"a host name is given twice: {' '.join(args.hosts)}")
        if args.head and args.head not in names:
            raise UsageError(f"--head {args.head}: not one of the hosts ({', '.join(names)})")
        check_jump(args.jump)
        if not re.match(r"^[A-Za-z0-9_-]+$", args.cluster) or args.cluster == "fleet":
            raise UsageError(f"--cluster {args.cluster}: letters, digits, _ and - (not 'fleet')")
        if args.endpoint and endpoint_problem(args.endpoint):
            raise UsageError(f"--endpoint {redact_url(args.endpoint)}: {endpoint_problem(args.endpoint)}")
        args.choices = parse_containers(args.container, names)
        setting, arms = load_setting(args.setting_from)
        probes = {t.name: HostProbe(t, Host(host_spec(t, args.option_values))) for t in targets}
        with contextlib.redirect_stdout(sys.stderr):  # the transports' progress stays off the YAML
            questions, text = survey(args, probes, setting, arms)
    except (UsageError, TransportError) as error:
        print(f"thermab discover: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2
    finally:
        for probe in probes.values():
            probe.host.close()
    found = [f for p in probes.values() for f in p.found]
    missing = [f for p in probes.values() for f in p.missing]
    print(render_table(found, missing), file=sys.stderr)
    if questions:
        print("", *(f"thermab discover: {question}" for question in questions), sep="\n", file=sys.stderr)
        return 2
    if text is None:
        print("\nthermab discover: no config written: a run needs what 'not found' lists above", file=sys.stderr)
        return 1
    if args.output:
        args.output.write_text(text)
        print(f"\nwrote {args.output}; check it: python -m thermab check-config {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0

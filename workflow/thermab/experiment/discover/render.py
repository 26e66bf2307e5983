"""The config discover writes, from what it found (pure): built from the hosts' plans and
the schema's defaults, then rendered as block YAML with a comment above each key."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import yaml

from thermab import config as thermab_config
from thermab.experiment.discover.host_setting import file_in_vllm
from thermab.experiment.discover.presets import Preset
from thermab.experiment.discover.refusals import Question
from thermab.experiment.discover.targets import Target

CLUSTER = "discovered"

# Platforms that shut down below what their thermal trip points tell (the interlock's own
# default, the lowest trip point − 8 °C, lies above it), by a word of nvidia-smi's GPU name:
# the interlock's limit discover writes, and why
PLATFORM_ABORT_AT_C = {
    "GB10": (
        85.0,
        "GB10 (DGX Spark class): below the ~87 °C band in which users reported shutdowns within"
        " 2 minutes (docs/study.md), where the default (lowest trip point − 8 °C) would lie above it."
        " The study's stock arm ran hotter (head TSOC up to 95 °C): raise this knowingly",
    ),
}


def platform_limit(gpus: tuple[str, ...]) -> tuple[float, str] | None:
    """The interlock's limit (°C) and its reason for hosts with these GPUs (nvidia-smi's
    names), the lowest of the platforms named; None where none is known."""
    known = [limit for word, limit in PLATFORM_ABORT_AT_C.items() for name in gpus if word in name.split()]
    return min(known, default=None)


@dataclass(frozen=True)
class HostPlan:
    target: Target
    preset: Preset
    python: str | None  # None where the file is patched on the host, outside the container
    value: str | None
    zones: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()  # nvidia-smi's GPU names (the platform: PLATFORM_ABORT_AT_C)


def build_config(
    plans: list[HostPlan],
    head: str,
    endpoint: str,
    model: str | None,
    setting: dict,
    arms: dict,
    options: dict,
    cluster: str = CLUSTER,
) -> tuple[dict, dict]:
    """The config and its comments (by key path), from what was found. Workers come first
    (start order), the head last."""
    files = {p.preset.file for p in plans}
    rel = file_in_vllm(setting["file"])
    if len(files) == 1:
        file, file_note = files.pop(), "found on every host"
    elif rel and all(p.python for p in plans):
        file, file_note = (
            "{vllm}/" + rel,
            "under each host's installed vllm (the paths differ: "
            + ", ".join(f"{p.target.name} {p.preset.file}" for p in plans)
            + ")",
        )
    else:
        raise Question(
            "the setting's file differs between hosts ("
            + ", ".join(f"{p.target.name}: {p.preset.file}" for p in plans)
            + "), and setting.file is one path for all: "
            "make them the same, or discover the hosts one at a time"
        )
    unread = [p.target.name for p in plans if p.value is None]
    if unread:
        raise Question(
            f"the anchor's match on {', '.join(unread)} does not read as setting.replacement with "
            "{value} in it: fix the setting (--setting-from) so both describe the same text"
        )
    values = {p.value for p in plans}
    if len(values) != 1:
        raise Question(
            "the hosts hold different values of the setting ("
            + ", ".join(f"{p.target.name}: {p.value}" for p in plans)
            + "): restore the stock file where it was patched"
        )
    stock = values.pop()
    reference, *others = arms
    ordered = [p for p in plans if p.target.name != head] + [p for p in plans if p.target.name == head]
    head_zones = next(p.zones for p in plans if p.target.name == head)
    timeline_zone = "TSOC" if "TSOC" in head_zones or not head_zones else head_zones[0]
    hosts, comments = {}, {}
    for plan in ordered:
        where = ("clusters", cluster, "hosts", plan.target.name)
        entry: dict = {"transport": plan.target.transport}
        if plan.target.transport == "ssh":
            entry.update(address=plan.target.address, port=plan.target.port)
            if plan.target.user:
                entry["user"] = plan.target.user
            for key in ("key_file", "known_hosts", "jump"):
                if options.get(key):
                    entry[key] = options[key]
            entry["host_key_policy"] = "strict"
        entry.update({k: v for k, v in plan.preset.settings.items() if k != "server"})
        if plan.python:
            entry["python"] = plan.python
        entry["server"] = plan.preset.settings["server"]
        hosts[plan.target.name] = entry
        comments[where] = f"preset: {plan.preset.name}. {plan.preset.reason}."
    found = {
        "order": "".join(arms),
        "repeats": 1,
        "setting": {
            "name": setting["name"],
            "method": "file",
            "file": file,
            "anchor": setting["anchor"],
            "replacement": setting["replacement"],
        },
        "arms": {reference: dict(arms[reference], value=stock), **{name: dict(arms[name]) for name in others}},
        "clusters": {cluster: {"head": head, "endpoint": endpoint, "end_state": "restarted", "hosts": hosts}},
    }
    # the schema's defaults (the study's timings, load, intervals), written out in full
    defaults = thermab_config.validate(found)
    config = {
        **{key: found[key] for key in ("order", "repeats", "setting", "arms")},
        "timings": defaults["timings"],
        "load": {**defaults["load"], "model": model},
        "monitor": {key: defaults["monitor"][key] for key in ("process_pattern", "intervals")},
        "analysis": dict(defaults["analysis"], timeline_zone=timeline_zone),
        "clusters": found["clusters"],
    }
    limit = platform_limit(tuple(name for p in plans for name in p.gpus))
    if limit is not None:
        config["safety"] = {"abort_at_c": limit[0]}
        comments[("safety", "abort_at_c")] = limit[1]
    comments.update(
        {
            ("setting", "file"): f"{file_note}; the anchor matches once there",
            ("arms", reference): "the value every host holds now",
            ("timings",): "the study's: 10-min baseline, 30-min loads; lower them here for a first trial "
            "(e.g. load_s: 300)",
            ("load", "model"): "the id /v1/models gave" if model else "null: the first id /v1/models gives at run time",
            ("monitor", "process_pattern"): "the API server by its command, the engine and workers by vLLM's process "
            "titles (plain `vllm` would also match a config named after vLLM)",
            ("analysis", "timeline_zone"): f"zones on {head}: {', '.join(head_zones)}"
            if head_zones
            else f"no thermal zones on {head}: the thermal tables will be empty",
            ("clusters", cluster, "end_state"): "after the run the server runs again on the original file, as found",
        }
    )
    for name in others:
        comments[("arms", name)] = (
            f"TODO: the {arms[name]['label']} arm's value is yours to choose ({arms[name]['value']} is the study's)"
        )
    return config, comments


def scalar(value) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, allow_unicode=True).strip()
    return text[: -len("\n...")].strip() if text.endswith("\n...") else text


def render_yaml(config: dict, comments: dict, header: str) -> str:
    """Block YAML with a comment above each key that has one."""
    lines = ["# " + line if line else "#" for line in header.splitlines()]

    def emit(mapping: dict, path: tuple, indent: int) -> None:
        pad = " " * indent
        for key, value in mapping.items():
            note = comments.get(path + (key,))
            if note:
                lines.extend(pad + "# " + line for line in textwrap.wrap(note, 96 - indent, break_on_hyphens=False))
            if isinstance(value, dict) and value:
                lines.append(f"{pad}{scalar(key)}:")
                emit(value, path + (key,), indent + 2)
            else:
                lines.append(f"{pad}{scalar(key)}: {scalar(value)}")

    emit(config, (), 0)
    return "\n".join(lines) + "\n"

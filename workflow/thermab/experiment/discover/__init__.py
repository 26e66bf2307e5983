"""``thermab discover`` (its usage: cli.py), along its seams:

- ``targets``: the hosts, jump host and containers the command line names;
- ``proc``, ``containers``: pure parsing of a host's /proc and of docker/podman inspect;
- ``servers``: which process is the vLLM server to measure, and which host serves the API;
- ``presets``: the lifecycle preset that fits how a server runs, one function per preset;
- ``setting``: the stock setting (package data, ``stock-setting.yaml``) or another
  config's, its file under vllm and the value it holds now;
- ``facts``: what was found with its source, what was not with why, as a table;
- ``render``: the config built from what was found, written as commented YAML;
- ``probe``: the edge, reading one host (read-only);
- ``cli``: the command, its exit status and the survey of every host.
"""

from thermab.experiment.discover.command import main
from thermab.experiment.discover.facts import summarize_agent
from thermab.experiment.discover.probe import PROCESS_PATTERN
from thermab.experiment.discover.refusals import Question, UsageError
from thermab.experiment.discover.targets import parse_target

__all__ = ["PROCESS_PATTERN", "Question", "UsageError", "main", "parse_target", "summarize_agent"]

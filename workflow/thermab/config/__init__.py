"""Load and check the workflow config: a strict YAML reader, JSON-schema validation with
defaults, then the checks a schema cannot express (templates, regexes, URLs, paths, what a
patch will write).  Everything is checked before any job runs; every error is one line
naming the config key (or the file) at fault.

- ``problems``: ConfigError, a problem's key and value written on one line;
- ``reader``: files read bounded, the strict YAML reader, config files layered;
- ``schema``: the schema, its defaults, one key's problems, ``--config`` values typed;
- ``patterns``: templates, regular expressions, one-line text;
- ``addresses``: endpoint URLs, ports, host names and addresses, host roots and paths;
- ``setting``: the setting and its arms (what a patch will write);
- ``questions``: the declared questions, the budget, the tune, the wake-up gaps;
- ``model``: HostSpec, ClusterSpec, the safety settings derived from a config, and the
  config's typed, read-only view (``view``: ``cfg.timings.load_s``; ``thaw`` gives the dict),
  whose sections (``Section``, ``Arm``, ``Question``) type a run's plan too (analysis.model);
- ``check``: ``validate``, every check tied together, and ``load``.

The names below are the package's own: callers import them from ``thermab.config``."""

from thermab.config.addresses import endpoint_address, endpoint_problem, port_problem, redact_url
from thermab.config.check import MAX_EXTRA_BODY, extra_body_problem, load, order_problems, thresholds_problems, validate
from thermab.config.problems import ConfigError
from thermab.config.question_keys import (
    MIN_DF,
    default_questions,
    first_testing_repeats,
    known_metric,
    phase_job_s,
    question_words,
    questions_problems,
    repeats_in_budget,
    residual_df,
)
from thermab.config.reader import DECIMAL_FLOAT, DECIMAL_INT, check_file, read_bounded, read_file
from thermab.config.schema import (
    SCHEMA,
    defaults,
    key_problem,
    key_problems,
    level_bounds,
    load_schema,
    maximum,
    top_level_defaults,
    typed_overrides,
)
from thermab.config.setting import literal_kind, literal_number
from thermab.config.view import (
    Arm,
    ClusterSpec,
    Config,
    HostSpec,
    Question,
    Section,
    Tune,
    abort_threshold,
    cluster_spec,
    sensor_silence_s,
    thaw,
    view,
)
from thermab.errors import UserError  # the rules catch it as thermab_config.UserError

__all__ = [
    "DECIMAL_FLOAT",
    "DECIMAL_INT",
    "MAX_EXTRA_BODY",
    "MIN_DF",
    "SCHEMA",
    "Arm",
    "ClusterSpec",
    "Config",
    "ConfigError",
    "HostSpec",
    "Question",
    "Section",
    "Tune",
    "UserError",
    "abort_threshold",
    "check_file",
    "cluster_spec",
    "default_questions",
    "defaults",
    "endpoint_address",
    "endpoint_problem",
    "extra_body_problem",
    "first_testing_repeats",
    "key_problem",
    "key_problems",
    "known_metric",
    "level_bounds",
    "maximum",
    "literal_kind",
    "literal_number",
    "load",
    "load_schema",
    "order_problems",
    "phase_job_s",
    "port_problem",
    "question_words",
    "questions_problems",
    "read_bounded",
    "read_file",
    "redact_url",
    "repeats_in_budget",
    "residual_df",
    "sensor_silence_s",
    "thaw",
    "thresholds_problems",
    "top_level_defaults",
    "typed_overrides",
    "validate",
    "view",
]

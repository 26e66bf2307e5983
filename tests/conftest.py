"""The test tiers as markers (docs/design.md, "Test tiers"): every test gets exactly one.

- ``unit``: the package's functions in this process (pure functions, parsers, files in a
  temporary directory); ``pytest -m unit`` is the quick loop while editing;
- ``integration``: starts local processes of its own (agents, the simulated server and
  nodes, Locust, the command line), or works at length in this one (a fit, a simulation of
  error rates, property checks or figures over whole runs: seconds each, listed in SLOW);
- ``e2e``: whole-workflow runs on the simulated cluster (marked in their files);
- ``real``: real components the tests start themselves (sshd, Docker, SLURM, vLLM, Chromium).

A test file's tier is named here, so a new file is a unit test until it says otherwise.
``pytest -m unit`` (any ``-m`` expression) does not even import a file whose tier it leaves
out, so the quick loop pays for the collection of its own files only."""

import pytest

import fleet

TIERS = ("unit", "integration", "e2e", "real")
FILE_TIERS = {
    "integration": {
        "test_agent.py",
        "test_cli_errors.py",
        "test_discover.py",
        "test_guardian.py",
        "test_interlock.py",
        "test_load.py",
        "test_package.py",
        "test_power.py",
        "test_sim.py",
        "test_config.py",
        "test_known_hosts.py",
        "test_agent_devices.py",
        "test_server_metrics.py",
        "test_hostile_config.py",
        "test_hostile_runs.py",
        "test_questions.py",
        "test_sequential.py",
        "test_config_properties.py",
        "test_levels.py",
        "test_lint.py",
    },
    "real": {
        "test_ssh.py",
        "test_docker.py",
        "test_vllm_cpu.py",
        "test_timeline_browser.py",
        "test_slurm.py",
        "test_load_tools.py",
    },
}

# in-process tests that take seconds each (measured with --durations; a whole-run analysis
# with figures, a calibration fit, a simulated decision rule, hypothesis over run.json)
SLOW = {
    "test_sim_calibration.py::test_shipped_calibration_is_the_fit_of_the_published_data",
    "test_analyze.py::test_any_value_in_run_json_is_analysed_or_named",
    "test_analyze.py::test_a_head_without_the_timeline_zone_is_told_which_zones_it_has",
    "test_analyze.py::test_bursty_probe_and_half_open_loop_are_stated_not_measured",
    "test_analyze.py::test_no_thresholds_asked_for",
    "test_analyze.py::test_ab_and_ba_pooled_separate_the_order_effect",
    "test_analyze.py::test_sweep_names_the_best_setting",
    "test_analyze.py::test_figures_render_for_the_study",
    "test_energy.py::test_synthetic_run_energy_table_summary_and_verdicts",
    "test_energy.py::test_timeline_power_panel_and_fleet_energy",
    "test_telemetry_layout.py::test_both_layouts_give_the_same_files",
    "test_stats.py::test_real_effect_has_power_and_null_effect_is_rarely_claimed",
    "test_analyze.py::test_wide_csv_import_matches_the_chart",
    "test_analyze.py::test_samples_that_are_not_finite_are_no_readings",
    "test_analyze.py::test_a_sample_given_twice_is_no_interval",
    "test_analyze.py::test_synthetic_run_with_retry_requests_and_cpu",
    "test_energy.py::test_runs_without_power_say_so",
    "test_tune.py::test_an_interrupted_study_gives_back_its_running_trial",
    "test_tune.py::test_the_answer_with_its_evidence",
    "test_tune.py::test_it_says_plainly_when_nothing_beat_the_reference_or_the_budget_ran_out",
    "test_tune.py::test_any_range_is_a_search_space_or_one_line_naming_the_tune",
}


def pytest_ignore_collect(collection_path, config):
    """A file of one tier, left out by ``-m``, is not imported at all."""
    tier = next((tier for tier, files in FILE_TIERS.items() if collection_path.name in files), None)
    if tier is None or not config.option.markexpr:
        return None
    try:
        from _pytest.mark.expression import Expression

        selected = Expression.compile(config.option.markexpr).evaluate(lambda name, **_kwargs: name == tier)
    except Exception:  # pytest's expression API is its own: where it changed, collect as before
        return None
    return True if not selected else None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.get_closest_marker(tier) for tier in TIERS):
            continue  # the file marks its own (e2e)
        if f"{item.path.name}::{item.originalname}" in SLOW:
            tier = "integration"
        else:
            tier = next((tier for tier, files in FILE_TIERS.items() if item.path.name in files), "unit")
        item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="session")
def local_fleet(tmp_path_factory):
    """The short simulated fleet, run locally once a session: test_fleet.py checks it and the
    SLURM tier compares its own run through the profile with it (one local run, not two)."""
    return fleet.run_local(tmp_path_factory.mktemp("fleet"))

"""Fit the simulated node's zone model to the study's published chart data.

::

    python -m thermab.sim.fit [--data tests/data/seed-repro-chart-data.json]
                              [--out workflow/thermab/sim/calibration.json]
                              [--figure docs/simulation-fit.png] [--check]

Writes the calibration the simulated nodes run with (``calibration.json``, read by
:mod:`thermab.sim.node`) and a figure of the fit against the published data.  ``--check``
fits and compares with the calibration already written instead (exit 1 when a parameter
moved by more than 2 %): the shipped model is the fit of the published data, nothing else.

The model is :mod:`thermab.sim.zones`; its inputs during the study's two load phases are
the study's own measurements (``STUDY_LOAD``): the head's vLLM processes used 398 % stock
and 212 % patched, the spin being the difference, held by two threads; the worker's
208 % and 206 %; the GPUs were busy throughout.  Outside the load windows the nodes idle.

1. Head, per zone: ambient, the two gains, the fast share and the two time constants, by
   least squares over the whole recording from minute 20 (both phases and cool-downs; the
   second phase's boot, minutes 96-107, is left out).
2. The reading noise: the residual sd of step 1 at idle (the baseline) and under load
   without a spinning thread (the settled patched phase), the median over the zones
   (for the worker, of its TSOC fit of step 4 in both settled phases).
3. Head TS1P, the hottest core of cluster 1: in the stock phase each sample reads either
   the core a spinning thread runs on (while one runs on cluster 1) or the cluster as in
   step 1.  TS1P's six parameters, the hot core's own fast share and heat per held core,
   and the share of samples with a spinning thread on cluster 1 are refitted together by
   maximum likelihood (a two-part mixture in the stock phase, the reading noise of step
   2, and the phase's mean as one more observation of its standard error).  The share is
   that of at least one of the emulator's two spinning threads (``HELD_THREADS``), so each
   is on cluster 1 with ``1 - (1 - share) ** (1/2)``.  The chart's 30-s samples show no
   runs of dips, so the dwell between moves is set well below a sample, not fitted
   (``PLACEMENT_DWELL_S``): the 1-s samples of the default run then read independent
   placements, as the chart's do.
4. Worker: only its TSOC was published.  Its zones are the head's with an ambient offset,
   a gain factor and a time factor, fitted to that TSOC (the hottest modelled zone).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from thermab.sim import zones as model

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "tests/data/seed-repro-chart-data.json"
CALIBRATION = Path(__file__).with_name("calibration.json")
FIGURE = REPO / "docs/simulation-fit.png"

LOAD_MIN = 30.0  # the study's load phases (data/README.md)
MARKS = {"stock": "ustock-load-start", "patched": "upatched-load-start"}
# The study's measurements during load (data/README.md): vLLM CPU sums in cores, GPU busy.
STUDY_LOAD = {
    # stock: two spinning threads hold a core each, the 1.86 of spin plus the ~0.14 the
    # same threads use patched (the emulator's engine and worker readers, thermab.sim.vllm)
    "head": {"stock": {"cpu_cores": 3.98, "held_cores": 2.0}, "patched": {"cpu_cores": 2.12, "held_cores": 0.0}},
    "worker": {"stock": {"cpu_cores": 2.08, "held_cores": 0.0}, "patched": {"cpu_cores": 2.06, "held_cores": 0.0}},
}
GPU_BUSY_UNDER_LOAD = 1.0
HELD_THREADS = 2  # spinning readers of the stock head: the engine's and the worker's (vllm.py)
FIT_FROM_MIN = 20.0  # the recording starts hot from an earlier run; by minute 20 it idles
BOOT_MIN = (96.2, 107.4)  # the patched server's boot heats a little; not modelled
SETTLED_AFTER_MIN = 5.0
STEP_S = 5.0  # integration step of the fit (the model is exact per step)
HEAD_ZONES = ("TS0E", "TS0P", "TS1E", "TS1P", "TGPU", "TUNC")
PLACEMENT_DWELL_S = 5.0  # study seconds: well below the chart's sample interval
TOLERANCE = 0.02


def load_data(path: Path) -> dict:
    data = json.loads(Path(path).read_text())
    marks = {mark["m"]: mark["t"] for mark in data["marks"]}
    starts = {arm: marks[name] * 60.0 for arm, name in MARKS.items()}
    head = {
        name: (np.array([p["t"] * 60.0 for p in data["head"]]), np.array([p[name] for p in data["head"]]))
        for name in HEAD_ZONES + (model.SOC_ZONE,)
    }
    worker = (np.array([p["t"] * 60.0 for p in data["workerTsoc"]]), np.array([p["TSOC"] for p in data["workerTsoc"]]))
    return {"starts": starts, "head": head, "worker": worker}


def arm_at(t: float, starts: dict) -> str | None:
    for arm, start in starts.items():
        if start <= t < start + LOAD_MIN * 60.0:
            return arm
    return None


def simulate(zone_params: dict, role: str, starts: dict, times: np.ndarray) -> dict:
    """Every zone's reading at ``times`` (s), and for a zone with a hot core (NAME.hot_core)
    the reading of the core a spinning thread runs on."""
    grid = np.arange(FIT_FROM_MIN * 60.0, times.max() + STEP_S, STEP_S)
    states = model.initial_states(zone_params, {})
    out = {name: np.empty(len(grid)) for name in states}
    for i, t in enumerate(grid):
        for name in states:
            out[name][i] = zone_params[name.split(".")[0]]["ambient_c"] + sum(states[name])
        arm = arm_at(t, starts)
        load = model.Load() if arm is None else model.Load(gpu_busy=GPU_BUSY_UNDER_LOAD, **STUDY_LOAD[role][arm])
        model.step(states, zone_params, load, STEP_S, 1.0)
    return {name: np.interp(times, grid, values) for name, values in out.items()}


def fitted_mask(times: np.ndarray) -> np.ndarray:
    return (times >= FIT_FROM_MIN * 60.0) & ~((times >= BOOT_MIN[0] * 60.0) & (times < BOOT_MIN[1] * 60.0))


def zone_from(vector) -> dict:
    ambient, c_cpu, c_gpu, fast_share, tau_fast, tau_slow = vector
    return {
        "ambient_c": ambient,
        "c_per_core": c_cpu,
        "c_at_gpu_busy": c_gpu,
        "fast_share": fast_share,
        "tau_fast_s": tau_fast,
        "tau_slow_s": tau_slow,
    }


def fit_head_zone(name: str, data: dict) -> dict:
    from scipy.optimize import least_squares

    times, values = data["head"][name]
    mask = fitted_mask(times)

    def residuals(vector):
        return (simulate({name: zone_from(vector)}, "head", data["starts"], times)[name] - values)[mask]

    start = [values[mask][:10].mean(), 2.0, 20.0, 0.5, 30.0, 300.0]
    bounds = ([30.0, 0.0, 0.0, 0.05, 2.0, 60.0], [60.0, 20.0, 60.0, 0.95, 600.0, 3600.0])
    return zone_from(least_squares(residuals, start, bounds=bounds, x_scale="jac").x)


def settled(times: np.ndarray, starts: dict, arm: str) -> np.ndarray:
    start = starts[arm]
    return (times >= start + SETTLED_AFTER_MIN * 60.0) & (times < start + LOAD_MIN * 60.0)


def reading_noise(head: dict, data: dict) -> dict:
    """The head's residual sd at idle (the baseline) and under load without a spinning
    thread (the settled patched phase), the median over its zones: the reading noise."""
    sds = {"idle": [], "load": []}
    for name, zone in head.items():
        times, values = data["head"][name]
        residual = values - simulate({name: zone}, "head", data["starts"], times)[name]
        idle = (times >= FIT_FROM_MIN * 60.0) & (times < data["starts"]["stock"])
        sds["idle"].append(residual[idle].std())
        sds["load"].append(residual[settled(times, data["starts"], "patched")].std())
    return {key: float(np.median(values)) for key, values in sds.items()}


def worker_noise(zones: dict, data: dict) -> dict:
    """The worker's TSOC residual sd at idle and under load (both settled phases: no
    thread spins on the worker in either)."""
    times, values = data["worker"]
    modelled = simulate(zones, "worker", data["starts"], times)
    residual = values - np.max(np.vstack([modelled[name] for name in HEAD_ZONES]), axis=0)
    idle = (times >= FIT_FROM_MIN * 60.0) & (times < data["starts"]["stock"])
    load = settled(times, data["starts"], "stock") | settled(times, data["starts"], "patched")
    return {"idle": float(residual[idle].std()), "load": float(residual[load].std())}


def fit_hot_core(zone: dict, data: dict, noise_c: float) -> dict:
    """Step 3: TS1P with its hot core, and the share of stock samples that read it."""
    from scipy.optimize import minimize
    from scipy.stats import norm

    times, values = data["head"]["TS1P"]
    mask = fitted_mask(times)
    stock = (times >= data["starts"]["stock"]) & (times < data["starts"]["stock"] + LOAD_MIN * 60.0)

    def with_core(vector):
        return dict(zone_from(vector[:6]), cluster=1, hot_core={"c_per_held_core": vector[7], "fast_share": vector[8]})

    def negative_log_likelihood(vector):
        modelled = simulate({"TS1P": with_core(vector)}, "head", data["starts"], times)
        cluster, hot, share = modelled["TS1P"], modelled["TS1P.hot_core"], vector[6]
        mixture = share * norm.pdf(values[stock], hot[stock], noise_c) + (1.0 - share) * norm.pdf(
            values[stock], cluster[stock], noise_c
        )
        # the phase's mean, as the study published it, is one more observation
        mean = (share * hot[stock] + (1.0 - share) * cluster[stock]).mean()
        return -(
            np.log(mixture + 1e-300).sum()
            + norm.logpdf(values - cluster, 0.0, noise_c)[mask & ~stock].sum()
            + norm.logpdf(mean, values[stock].mean(), noise_c / math.sqrt(stock.sum()))
        )

    start = [
        zone[key] for key in ("ambient_c", "c_per_core", "c_at_gpu_busy", "fast_share", "tau_fast_s", "tau_slow_s")
    ] + [0.7, 2.0, 0.9]
    bounds = [
        (30.0, 60.0),
        (0.0, 20.0),
        (0.0, 60.0),
        (0.05, 1.0),
        (2.0, 600.0),
        (60.0, 3600.0),
        (0.05, 0.99),
        (0.0, 20.0),
        (0.05, 1.0),
    ]
    vector = minimize(negative_log_likelihood, start, method="L-BFGS-B", bounds=bounds).x
    return {"zone": with_core(vector), "share": float(vector[6])}


def scaled_zones(head: dict, offset: float, gain: float, time: float) -> dict:
    return {
        name: dict(
            zone,
            ambient_c=zone["ambient_c"] + offset,
            c_per_core=zone["c_per_core"] * gain,
            c_at_gpu_busy=zone["c_at_gpu_busy"] * gain,
            tau_fast_s=zone["tau_fast_s"] * time,
            tau_slow_s=zone["tau_slow_s"] * time,
        )
        for name, zone in head.items()
    }


def fit_worker(head: dict, data: dict) -> dict:
    from scipy.optimize import least_squares

    times, values = data["worker"]
    mask = fitted_mask(times)

    def residuals(vector):
        modelled = simulate(scaled_zones(head, *vector), "worker", data["starts"], times)
        return (np.max(np.vstack([modelled[name] for name in head]), axis=0) - values)[mask]

    offset, gain, time = least_squares(residuals, [-3.0, 1.0, 1.0], bounds=([-15, 0.3, 0.2], [5, 3, 5])).x
    return {"ambient_offset_c": float(offset), "gain_factor": float(gain), "time_factor": float(time)}


def fit(path: Path = DATA) -> dict:
    """The calibration: head zones, placement, worker scaling (rounded as shipped)."""
    data = load_data(path)
    head = {name: fit_head_zone(name, data) for name in HEAD_ZONES}
    noise = reading_noise(head, data)
    hot = fit_hot_core(head["TS1P"], data, noise["load"])
    head["TS1P"] = hot["zone"]
    worker = fit_worker(head, data)
    noise = {
        "head": noise,
        "worker": worker_noise(
            scaled_zones(head, worker["ambient_offset_c"], worker["gain_factor"], worker["time_factor"]), data
        ),
    }

    def rounded(value):
        if isinstance(value, dict):
            return {key: rounded(item) for key, item in value.items()}
        return round(value, 4) if isinstance(value, float) else value

    return {
        "source": "python -m thermab.sim.fit on tests/data/seed-repro-chart-data.json (the study's chart data)",
        "units": "°C, cores, GPU busy share, seconds of the study (divide by the run's time compression)",
        "study_load": STUDY_LOAD,
        "placement": {
            "cluster1_share": rounded(1.0 - (1.0 - hot["share"]) ** (1.0 / HELD_THREADS)),
            "stock_samples_on_hot_core": rounded(hot["share"]),
            "held_threads": HELD_THREADS,
            "dwell_s": PLACEMENT_DWELL_S,
        },
        "noise_c": rounded(noise),
        "head": {name: rounded(zone) for name, zone in head.items()},
        "worker": {key: rounded(value) for key, value in worker.items()},
    }


def worker_zones(calibration: dict) -> dict:
    worker = calibration["worker"]
    return scaled_zones(calibration["head"], worker["ambient_offset_c"], worker["gain_factor"], worker["time_factor"])


# ---- what the fit says, against the published numbers --------------------------------


def expected_curves(calibration: dict, data: dict) -> dict:
    """The model on a fine grid: every head zone, TS1P's hot core, the expected TS1P and
    TSOC (the hot core read for the fitted share of the stock phase), the worker's TSOC."""
    times = np.arange(FIT_FROM_MIN * 60.0, data["head"]["TSOC"][0].max(), 5.0)
    head = simulate(calibration["head"], "head", data["starts"], times)
    share = calibration["placement"]["stock_samples_on_hot_core"] * np.array(
        [arm_at(t, data["starts"]) == "stock" for t in times]
    )
    others = np.max(np.vstack([head[name] for name in HEAD_ZONES if name != "TS1P"]), axis=0)
    hot = np.maximum(head["TS1P"], head["TS1P.hot_core"])
    head["TSOC"] = share * np.maximum(hot, others) + (1 - share) * np.maximum(head["TS1P"], others)
    head["TS1P cluster"] = head["TS1P"]
    head["TS1P"] = share * hot + (1 - share) * head["TS1P"]
    worker = simulate(worker_zones(calibration), "worker", data["starts"], times)
    return {"t": times, "head": head, "worker": np.max(np.vstack([worker[name] for name in HEAD_ZONES]), axis=0)}


def report(calibration: dict, data: dict) -> str:
    curves = expected_curves(calibration, data)
    lines = ["zone   arm      published mean  model mean"]
    for name in ("TSOC", "TS1P", "TUNC", "TGPU", "TS0P"):
        times, values = data["head"][name]
        for arm in MARKS:
            window = (times >= data["starts"][arm]) & (times < data["starts"][arm] + LOAD_MIN * 60)
            grid = (curves["t"] >= data["starts"][arm]) & (curves["t"] < data["starts"][arm] + LOAD_MIN * 60)
            lines.append(
                "%-6s %-8s %8.1f        %8.1f" % (name, arm, values[window].mean(), curves["head"][name][grid].mean())
            )
    times, values = data["worker"]
    for arm in MARKS:
        window = (times >= data["starts"][arm]) & (times < data["starts"][arm] + LOAD_MIN * 60)
        grid = (curves["t"] >= data["starts"][arm]) & (curves["t"] < data["starts"][arm] + LOAD_MIN * 60)
        lines.append("worker %-8s %8.1f        %8.1f" % (arm, values[window].mean(), curves["worker"][grid].mean()))
    start = data["starts"]["stock"]
    after = curves["t"] >= start
    for threshold in (85, 90, 92):
        reached = curves["t"][after & (curves["head"]["TS1P.hot_core"] >= threshold)]
        lines.append(
            "stock: the hot core reaches %d °C after %s"
            % (threshold, "%.1f min" % ((reached[0] - start) / 60) if len(reached) else "never")
        )
    return "\n".join(lines)


def figure(calibration: dict, data: dict, path: Path) -> None:
    from thermab.headless import plt  # the Agg backend, literal text; only when a figure is drawn

    curves = expected_curves(calibration, data)
    colours = {"TSOC": "tab:red", "TUNC": "tab:blue", "TGPU": "tab:green", "TS0P": "black"}
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharey="row")
    for column, arm in enumerate(MARKS):
        start = data["starts"][arm]
        span = (start - 3 * 60, start + (LOAD_MIN + 8) * 60)
        grid = (curves["t"] >= span[0]) & (curves["t"] < span[1])
        minutes = (curves["t"][grid] - start) / 60.0
        ax = axes[0, column]
        for name, colour in colours.items():
            times, values = data["head"][name]
            shown = (times >= span[0]) & (times < span[1])
            ax.plot((times[shown] - start) / 60.0, values[shown], ".", color=colour, ms=4)
            ax.plot(
                minutes,
                curves["head"][name][grid],
                "-",
                color=colour,
                lw=1.5,
                label=name + (" = TS1P (expected)" if name == "TSOC" and arm == "stock" else ""),
            )
        if arm == "stock":
            load = (minutes >= 0) & (minutes < LOAD_MIN)
            ax.plot(
                minutes[load],
                curves["head"]["TS1P.hot_core"][grid][load],
                ":",
                color="tab:red",
                lw=1,
                label="TS1P, a spinning thread on cluster 1",
            )
            ax.plot(
                minutes[load],
                curves["head"]["TS1P cluster"][grid][load],
                "--",
                color="tab:red",
                lw=1,
                label="TS1P, none on cluster 1",
            )
        ax.set_title("head, %s (study: dots; model: lines)" % arm)
        ax.legend(fontsize=7, loc="lower center")
        ax = axes[1, column]
        times, values = data["worker"]
        shown = (times >= span[0]) & (times < span[1])
        ax.plot((times[shown] - start) / 60.0, values[shown], ".", color="tab:purple", ms=4)
        ax.plot(minutes, curves["worker"][grid], "-", color="tab:purple", label="worker TSOC")
        ax.set_title("worker, %s" % arm)
        ax.legend(fontsize=7, loc="lower center")
        ax.set_xlabel("minutes after load start (study); the default run takes 2 s for each")
    for ax in axes[:, 0]:
        ax.set_ylabel("°C")
    for ax in axes.flat:
        ax.axvspan(0, LOAD_MIN, color="0.92", zorder=0)
        ax.grid(alpha=0.3)
    fig.suptitle("Simulated GB10 zone model fitted to the study's chart data (python -m thermab.sim.fit)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def differences(fitted, shipped, where="") -> list[str]:
    if isinstance(fitted, dict):
        return [line for key in fitted for line in differences(fitted[key], shipped.get(key), f"{where}.{key}")]
    if isinstance(fitted, float) and isinstance(shipped, (int, float)):
        if abs(fitted - shipped) > TOLERANCE * max(abs(fitted), abs(shipped), 0.05):
            return [f"{where}: fitted {fitted}, shipped {shipped}"]
        return []
    return [] if fitted == shipped else [f"{where}: fitted {fitted!r}, shipped {shipped!r}"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m thermab.sim.fit", description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=CALIBRATION)
    parser.add_argument("--figure", type=Path, default=FIGURE)
    parser.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = parser.parse_args(argv)
    calibration = fit(args.data)
    data = load_data(args.data)
    print(report(calibration, data))
    if args.check:
        problems = differences(calibration, json.loads(args.out.read_text()))
        print("\n".join(problems) or "%s is the fit of %s" % (args.out, args.data))
        return 1 if problems else 0
    args.out.write_text(json.dumps(calibration, indent=1, ensure_ascii=False) + "\n")
    figure(calibration, data, args.figure)
    print("wrote %s and %s" % (args.out, args.figure))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""TPE against GP (Optuna) on a cheap noisy stand-in of the spin-wait tune (docs/tune.md).

The stand-in has the study's shape: CPU saved grows as ``busy_loop_s`` shrinks, and below a
threshold the lost wake-up stalls streams with a probability that rises as the spin
shortens.  A trial reports the CPU (noisy) and is infeasible when its stalls show.  Each
sampler gets the same budget of trials (as a tune of that many trials would), over many
seeds and thresholds; printed: how often the chosen value is feasible in truth and saves at
least 80 % of the spin, and the median share of the spin saved.

    python bench/bench_tune_samplers.py [--trials 6] [--repeats 40] [--startup 3] [--samplers tpe,gp] [--grid] [--quick]

``--grid``: the first ``--startup`` trials are the tune's initial design (a grid across the
range, ``thermab.tune.racing.initial_values``, the reference's 1 left out) instead of random draws.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time

import optuna

STEP_S = 0.04  # a decode step: a spin at least this long never parks (stock's CPU)
SPIN_PCT = 200.0  # two readers, a core each


def spin_share(value: float) -> float:
    return min(1.0, (value + 0.003) / STEP_S)


def stall_probability(value: float, threshold: float) -> float:
    """Stalls appear below ``threshold``, more often the shorter the spin."""
    return 0.0 if value >= threshold else min(1.0, 0.9 * (1 - value / threshold) + 0.2)


def run(sampler_name: str, trials: int, seed: int, threshold: float, startup: int, grid: bool = False) -> float:
    rng = random.Random(seed)

    options = dict(n_startup_trials=1 if grid else startup, seed=seed)
    sampler = optuna.samplers.GPSampler(**options) if sampler_name == "gp" else optuna.samplers.TPESampler(**options)
    study = optuna.create_study(sampler=sampler, direction="minimize")
    if grid:
        from thermab.config import Tune
        from thermab.tune.racing import initial_values

        tune = Tune({"min": 0.0005, "max": 1, "scale": "log", "startup_trials": startup, "digits": 3})
        for value in initial_values(tune, reference=1.0):
            study.enqueue_trial({"value": value})
    for _ in range(trials):
        trial = study.ask({"value": optuna.distributions.FloatDistribution(0.0005, 1, log=True)})
        value = trial.params["value"]
        stalled = any(rng.random() < stall_probability(value, threshold) for _ in range(2))  # two phases
        trial.set_constraint("violation", 1.0 if stalled else 0.0)
        study.tell(trial, SPIN_PCT * spin_share(value) + rng.gauss(0, 8))
    feasible = [t for t in study.trials if t.constraints["violation"] <= 0]
    if not feasible:
        return math.nan
    chosen = min(feasible, key=lambda t: t.value).params["value"]
    return math.nan if stall_probability(chosen, threshold) > 0 else 1 - spin_share(chosen)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--startup", type=int, default=3, help="random trials before the model (tune.startup_trials)")
    parser.add_argument("--samplers", default="tpe,gp")
    parser.add_argument("--grid", action="store_true", help="the tune's grid as the first trials (tune.startup_trials)")
    parser.add_argument("--quick", action="store_true", help="one seed, TPE alone (GP needs PyTorch): that it runs")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.samplers = 1, "tpe"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    for name in args.samplers.split(","):
        started = time.process_time()
        saved = [
            run(name, args.trials, seed, threshold, args.startup, args.grid)
            for seed in range(args.repeats)
            for threshold in (0.002, 0.003, 0.004)
        ]
        good = [s for s in saved if not math.isnan(s)]
        print(
            f"{name}: {args.trials} trials ({args.startup} {'of the grid' if args.grid else 'at random'}) "
            f"x {len(saved)} searches: chosen value stalls or none feasible "
            f"{sum(math.isnan(s) for s in saved)}, saves >= 80 % in {sum(s >= 0.8 for s in good)}/{len(saved)}, "
            f"median saved {statistics.median(good) if good else math.nan:.2f}; "
            f"sampler CPU {time.process_time() - started:.1f} s"
        )


if __name__ == "__main__":
    main()

"""The stages of rules/monitor.smk: the monitor started (a guardian, the simulated hardware,
one agent per host) before the baseline, and stopped after the last phase (every host
restored, the logs pulled, the clocks measured again against preflight's)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from thermab.contracts import Preflight
from thermab.errors import StageFailed
from thermab.experiment import guardian, lease
from thermab.experiment.cluster import ClusterRun, clock_offsets, offsets_record
from thermab.hosts import clock
from thermab.telemetry import deploy


def bring_up(run: ClusterRun) -> None:
    """The run's leases held first (a job of another run is refused there, nothing
    changed), then a guardian watching this Snakemake, then hardware and agents: from here
    on, whatever happens is cleaned up."""
    run.write_session()
    lease.hold(run.lease_sites, run.run_dir)
    guardian.ensure(run.run_dir)
    run.ensure_up()


def monitor_start(run: ClusterRun, out_path: Path) -> None:
    run.event("run_start", detail={"cluster": run.cluster.name})
    bring_up(run)
    out_path.write_text(
        json.dumps(
            {
                "session": run.session,
                "t": time.time(),
                "agents": {h.name: deploy.agent_pid(h, run.session) for h in run.hosts},
            },
            indent=1,
        )
    )


def clock_drift(run: ClusterRun, offsets_end: dict[str, clock.Offset]) -> dict[str, float]:
    """Hosts whose clock moved against the controller's during the run by more than the
    two measurements' uncertainties explain (ingest corrects with the mean of the two)."""
    start = Preflight.read(run.files.preflight)
    uncertainty = start.clock_offset_uncertainty_s
    drifts = {}
    for name, end in offsets_end.items():
        if name in uncertainty:
            moved = clock.drift(clock.Offset(start.clock_offset_s[name], uncertainty[name], 0), end)
            if moved is not None:
                drifts[name] = moved
                run.progress(
                    f"WARNING clock of {name} moved {moved * 1000:+.1f} ms against the controller "
                    f"during the run (more than the ± {(uncertainty[name] + end.uncertainty_s) * 1000:.1f} ms "
                    "the two measurements allow); its samples are placed with the mean offset"
                )
    return drifts


def monitor_stop(run: ClusterRun, out_path: Path) -> None:
    """End of the run: restore, stop, pull every host's logs, release the guardian."""
    offsets_end, clock_problems = clock_offsets(run.hosts)
    problems = run.shutdown("completed")
    run.event("run_end", detail={"problems": problems})
    guardian.release(run.run_dir)
    for problem in clock_problems.values():
        run.progress(f"WARNING clock offset at the end not measured: {problem}")
    out_path.write_text(
        json.dumps(
            {
                "t": time.time(),
                **offsets_record(offsets_end, "clock_offset_end"),
                "clock_drift_s": clock_drift(run, offsets_end),
                "problems": problems,
            },
            indent=1,
        )
    )
    if problems:
        raise StageFailed("the run ended with problems (see above); logs pulled where possible")

"""Who holds the hosts and the endpoint of a run's cluster, and breaking those leases on purpose.

    python -m thermab lease RUN_DIR [--break]

shows, for each host of the run's cluster and for its endpoint, who holds its lease (user,
controller host, since when, which run, the controller's pid; stale where that controller is
known to be gone) or how the lease is damaged, and with --break breaks each: for a run that
is over but could not give them back (its controller lost), never for one that is running.
A run takes the leases at preflight and gives them back when it puts its hosts back; the
lease is the directory /tmp/thermab-lease on each host (under its root where it has one),
and the endpoint's /tmp/thermab-lease-port-PORT on the head host itself."""

from __future__ import annotations

import sys
from pathlib import Path

from thermab import cli
from thermab.errors import UserError
from thermab.experiment import lease
from thermab.experiment.cluster import ClusterRun
from thermab.hosts.transport import TransportError
from thermab.layout import RunDir


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser("lease", __doc__, epilog="exit status: 0 done; 1 a host not reached or a lease not broken")
    parser.add_argument("run_dir", type=Path, help="a run directory of the cluster (results/CLUSTER/ORDER)")
    parser.add_argument(
        "--break", dest="break_", action="store_true", help="break every lease of the run's cluster, whoever holds it"
    )
    args = parser.parse_args(argv)
    session = RunDir(args.run_dir).session
    if not session.is_file():
        raise UserError(f"{args.run_dir}: no {session.name}: not a run directory a run has started")
    try:
        run = ClusterRun.from_session(args.run_dir)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise UserError(f"{session}: not a session thermab wrote ({type(error).__name__}: {error})") from None
    own = lease.run_id(args.run_dir, create=False)
    failed = False
    for site in run.lease_sites:
        try:
            found = lease.break_lease(site) if args.break_ else lease.read(site)
        except TransportError as error:
            print(error, file=sys.stderr)  # it names the host
            failed = True
            continue
        mark = " (this run)" if found.holder and found.holder.run_id == own else ""
        verb = "broke the lease, " if args.break_ and not found.free else ""
        print(f"{site.name}: {verb}{found.describe()}{mark}")
    return 1 if failed else 0

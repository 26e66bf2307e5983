"""experiment: the run on the hosts. ``plan`` (phases, run.json), ``preflight``, ``phase``,
``patch``, ``server`` (lifecycle commands), ``cluster`` (one cluster run's hosts and
shutdown), ``guardian``, ``restore``, ``events``."""

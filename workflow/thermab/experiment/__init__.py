"""experiment: the run on the hosts. ``plan`` (phases, run.json), ``preflight``,
``monitor``, ``phase``, ``interlock``, ``patch``, ``server`` (lifecycle commands),
``cluster`` (one cluster run's hosts and shutdown), ``guardian``, ``restore``, ``events``,
``discover``."""

"""The names of the per-phase metrics the arms are compared on (``variance.csv``'s
``metric``, the verdicts, the best setting, the fleet report, the dose response): one owner,
so a name is never rebuilt by hand where it is looked up."""

OUTPUT_THROUGHPUT = "output throughput"
PROBE_DECODE_SPEED = "probe decode speed"
STALL_GAPS = "stall gaps"
CLUSTER_ENERGY_PER_TOKEN = "cluster energy per token"


def zone_mean(host: str, zone: str) -> str:
    """The mean of ``zone`` on ``host`` over the load window (e.g. "head TSOC mean")."""
    return f"{host} {zone} mean"


def cpu_median(host: str) -> str:
    """The median vLLM CPU of ``host`` over the load window (e.g. "head vLLM CPU median")."""
    return f"{host} vLLM CPU median"

"""matplotlib as thermab draws with it: figures are files, never windows (the Agg
backend), and every text is drawn as written.  Names from the config and the hosts (a
zone, the timeline zone, a metric named after one) would otherwise be parsed as mathtext,
and one such as "$x^$" stops the figure.  Every module that draws imports ``plt`` (and the
axis formatters, ``ticker``; the axes' type, ``Axes``) from here, so matplotlib is configured
before any use."""

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["text.parse_math"] = False
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

__all__ = ["Axes", "plt", "ticker"]

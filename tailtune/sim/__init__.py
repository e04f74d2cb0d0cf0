"""Discrete-event model of Triton's dynamic batcher, for benchmarks and planning.

It reports `WindowStats`, the fields of the `Observation` the Prometheus reader gives
(`tailtune.offline.simobs` converts), so the tuner runs unchanged against it.
"""

from tailtune.sim.arrivals import MAX_REQUESTS, Trace, deterministic, diurnal, mmpp, poisson, step
from tailtune.sim.cluster import SimCluster, WindowStats
from tailtune.sim.curves import ServiceCurve, bert_base_l4, linear_power, named_curve

__all__ = [
    "MAX_REQUESTS",
    "ServiceCurve",
    "SimCluster",
    "Trace",
    "WindowStats",
    "bert_base_l4",
    "deterministic",
    "diurnal",
    "linear_power",
    "mmpp",
    "named_curve",
    "poisson",
    "step",
]

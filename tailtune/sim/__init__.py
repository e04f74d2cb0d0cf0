"""Discrete-event model of Triton's dynamic batcher, for benchmarks and planning.

It reports the same `Observation` the Prometheus reader gives, so the tuner runs unchanged against it.
"""

from tailtune.sim.arrivals import Trace, deterministic, diurnal, mmpp, poisson, step
from tailtune.sim.cluster import Cluster
from tailtune.sim.curves import ServiceCurve, bert_base_l4, linear_power, named_curve

__all__ = [
    "Cluster",
    "ServiceCurve",
    "Trace",
    "bert_base_l4",
    "deterministic",
    "diurnal",
    "linear_power",
    "mmpp",
    "named_curve",
    "poisson",
    "step",
]

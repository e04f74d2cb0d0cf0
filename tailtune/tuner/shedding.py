"""Load shedding: the queue timeout past which a request can no longer be answered within the SLO. Pure.

Triton's `default_queue_policy` times a request from its enqueue and, when the dynamic batcher next looks at the
queue, rejects it once its wait passes `default_timeout_microseconds` (queue time only: a dispatched request runs
to its end). A request dispatched after waiting w is answered after at most w + instances x t(max batch): its own
batch, and on one device the batches of the other instances ahead of it (the device runs them one at a time).
Rejecting it once w passes T = SLO - instances x t(max batch) therefore leaves every answered request within the
SLO, and T moves with the batching in force, so it is rendered with it and reloads with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tailtune.api.v1alpha1 import Batching

# A batch's execution time spreads around the figure measured for it (the build's median, the live statistics'
# mean): the timeout leaves this share of the batches' time for it. Under a full queue every answered request has
# waited close to the timeout, so the answered tail is the timeout plus the batches' tail; the simulator's device
# noise (lognormal, 3 %) puts its 99th percentile at +7 %, inside this allowance.
EXECUTION_SPREAD = 0.1


def light_load_wait_us(delay_us: int, single_ms: float) -> float:
    """The queue wait of a request at a light load: held for the batch delay `delay_us` (on purpose, to let a batch
    form), behind at most one single-request batch on its instance (`single_ms` = t(1))."""
    return delay_us + 1000.0 * single_ms


def _budget_us(slo_ms: float, batch_ms: float, instances: int) -> float:
    """The SLO less what a dispatched request can still take: its batch and, on one device, the other instances'
    batches ahead of it, each with the spread allowance."""
    return 1000.0 * slo_ms - instances * 1000.0 * batch_ms * (1.0 + EXECUTION_SPREAD)


def shed_timeout_us(
    slo_ms: float, batching: Batching, service_ms: tuple[float, float] | None, instances: int = 1
) -> int:
    """Triton's `default_timeout_microseconds` for shedding under `batching` (>= 1: Triton reads 0 as no timeout).

    T = SLO - instances x t(max batch) x (1 + EXECUTION_SPREAD), from `service_ms` = (t(1), t(max batch)) on the
    engine's measured curve. Floor: `light_load_wait_us`. A shorter timeout would reject requests at a light load,
    which the config serves by design. Under the floor, answered requests may miss the SLO by the difference: such a
    config cannot hold it at its max batch (`shed_batch_max` keeps the tuner below it). Without a measured curve
    (`service_ms` None) T is the whole SLO, never below the batch delay: the queue wait alone stays within it.
    """
    delay_us = batching.max_queue_delay_microseconds
    if service_ms is None:
        return max(math.floor(1000.0 * slo_ms), delay_us, 1)
    single_ms, batch_ms = service_ms
    budget = _budget_us(slo_ms, batch_ms, instances)
    return max(math.floor(budget), math.ceil(light_load_wait_us(delay_us, single_ms)), 1)


def shed_batch_max(
    slo_ms: float, service_ms: Callable[[int], float], instances: int, top: int, delay_us: int = 0
) -> int:
    """The largest max batch up to `top` whose shedding timeout is above its floor (a full batch still meets the SLO
    after a light load's wait, at the batch delay `delay_us`); 0 when not even a batch of one does.

    With shedding on, the tuner stays at or below it: past it the timeout sits at its floor, so under a full queue
    the answered requests miss the SLO, and a larger batch adds only requests that cannot meet it.
    """
    floor = light_load_wait_us(delay_us, service_ms(1))
    best = 0
    for b in range(1, top + 1):
        if _budget_us(slo_ms, service_ms(b), instances) < floor:
            break  # t(b) never shrinks with b: no larger batch fits either
        best = b
    return best

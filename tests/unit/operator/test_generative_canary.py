"""The generative canary's judge (`rollout.judge_llm_canary` through `rollout.decide_rollout`): the canary pod's own
TTFT and TPOT percentiles over its window against the targets and against the other pods past the noise their sample
sizes allow (`rollout.noise_margin`), and a wait on a window too thin to judge. Generated cases: each draws targets,
figures and sample sizes (numpy, seeded), and the statistical ones draw each pod's requests and take their sample
percentile as the pod's histogram would."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from tailtune.api.v1alpha1 import Batching, LlmServing
from tailtune.operator.rollout import (
    CANARY_NOISE_Z,
    CANARY_WAITING,
    PROMOTING,
    ROLLING_BACK,
    PodObservation,
    RolloutPolicy,
    RolloutState,
    RolloutStep,
    decide_rollout,
    noise_margin,
    quantile_relative_error,
)
from tailtune.tuner.generative import MIN_REQUESTS

NOW = datetime(2026, 12, 6, 3, 0, tzinfo=UTC)
WINDOW_S = 30.0
CANARY, OTHER, THIRD = "10.0.0.1", "10.0.0.2", "10.0.0.3"
OLD = LlmServing()
NEW = LlmServing(kv_cache_free_gpu_mem_fraction=0.95)
CASES = 25


@dataclass(frozen=True)
class Case:
    """Targets and sample sizes of one generated case."""

    ttft_target: float
    tpot_target: float
    percentile: float
    n_canary: int
    n_other: int

    def policy(self) -> RolloutPolicy:
        return RolloutPolicy(
            slo_ms=self.ttft_target, window_seconds=WINDOW_S, min_samples=MIN_REQUESTS, tpot_slo_ms=self.tpot_target,
            percentile=self.percentile, tpot_percentile=self.percentile,
        )  # fmt: skip

    def margin(self) -> float:
        return noise_margin(self.percentile, self.n_canary, self.n_other)


def cases(seed: int) -> list[Case]:
    rng = np.random.default_rng(seed)
    return [
        Case(
            ttft_target=float(rng.uniform(200, 3000)),
            tpot_target=float(rng.uniform(15, 150)),
            percentile=float(rng.choice([90.0, 95.0, 99.0])),
            n_canary=int(rng.integers(MIN_REQUESTS, 2000)),
            n_other=int(rng.integers(MIN_REQUESTS, 2000)),
        )
        for _ in range(CASES)
    ]


def state(waited_s: float = WINDOW_S + 1) -> RolloutState:
    return RolloutState(
        target=Batching(), previous=Batching(), canary=CANARY, since=NOW - timedelta(seconds=waited_s),
        started=NOW - timedelta(seconds=waited_s + 5), llm_target=NEW, llm_previous=OLD,
    )  # fmt: skip


def pod(ttft: float, tpot: float, n: int, settings: LlmServing) -> PodObservation:
    return PodObservation(True, p_ms=ttft, samples=n, llm=settings, tpot_ms=tpot, tpot_samples=n)


def judge(case: Case, canary: tuple[float, float], others: tuple[float, float], waited_s: float = WINDOW_S + 1
          ) -> RolloutStep:  # fmt: skip
    pods = {
        CANARY: pod(*canary, case.n_canary, NEW),
        OTHER: pod(*others, case.n_other, OLD),
        THIRD: pod(*others, case.n_other, OLD),
    }
    return decide_rollout(state(waited_s), pods, case.policy(), NOW)


def promoted(step: RolloutStep) -> bool:
    return step.code == PROMOTING and step.state is not None and step.state.stage == "promoting"


def rejected(step: RolloutStep) -> bool:
    return step.code == ROLLING_BACK and step.reloads == ((CANARY, Batching()),)


def test_the_noise_of_a_sample_percentile_is_the_exponential_tails_by_hand() -> None:
    """sqrt(p / (n (1 - p))) / ln(1 / (1 - p)): P99 on 100 requests 0.216; it halves as n quadruples; the margin of two
    windows adds their errors in quadrature, CANARY_NOISE_Z of them."""
    assert quantile_relative_error(99, 100) == pytest.approx(math.sqrt(0.99 / 1.0) / math.log(100), rel=1e-9)
    assert quantile_relative_error(99, 100) == pytest.approx(0.216, abs=1e-3)
    assert quantile_relative_error(99, 400) == pytest.approx(quantile_relative_error(99, 100) / 2)
    r = quantile_relative_error(95, 300)
    assert noise_margin(95, 300, 300) == pytest.approx(CANARY_NOISE_Z * math.sqrt(2) * r)


@pytest.mark.parametrize("case", cases(1), ids=lambda c: f"P{c.percentile:g}-n{c.n_canary}")
def test_a_canary_within_its_targets_and_the_other_pods_noise_is_promoted(case: Case) -> None:
    """Within both targets and no worse than the others past the noise: promoted, the message naming both figures
    (caught: the canary was judged on its reload and readiness only, or against a fixed margin)."""
    rng = np.random.default_rng(case.n_canary)
    others = (case.ttft_target * rng.uniform(0.3, 0.9), case.tpot_target * rng.uniform(0.3, 0.9))
    # At most the noise's bound over the others, and within the targets.
    up = 1 + case.margin() * rng.uniform(0, 0.99)
    canary = (min(case.ttft_target, others[0] * up), min(case.tpot_target, others[1] * up))
    step = judge(case, canary, others)
    assert promoted(step), step
    assert step.state is not None and "TTFT" in step.state.verdict and "TPOT" in step.state.verdict


@pytest.mark.parametrize("case", cases(2), ids=lambda c: f"P{c.percentile:g}-n{c.n_canary}")
def test_a_canary_past_a_target_or_the_noise_is_rejected_naming_the_figure(case: Case) -> None:
    """Over the TTFT target (the others within it), over the TPOT target, or within both but worse than the others past
    the noise: rolled back, the message naming the figure, its value and the target or bound."""
    rng = np.random.default_rng(case.n_other)
    others = (case.ttft_target * rng.uniform(0.3, 0.6), case.tpot_target * rng.uniform(0.3, 0.6))
    over_ttft = (case.ttft_target * rng.uniform(1.001, 3), others[1])
    step = judge(case, over_ttft, others)
    assert rejected(step) and f"TTFT P{case.percentile:g} {over_ttft[0]:.1f} ms over the target" in step.message
    over_tpot = (others[0], case.tpot_target * rng.uniform(1.001, 3))
    step = judge(case, over_tpot, others)
    assert rejected(step) and f"TPOT P{case.percentile:g} {over_tpot[1]:.1f} ms over the target" in step.message
    past_noise = others[1] * (1 + case.margin()) * 1.001
    if past_noise < case.tpot_target:  # within the target, past the noise of the others
        step = judge(case, (others[0], past_noise), others)
        assert rejected(step) and "TPOT" in step.message and "worse than the other pods'" in step.message, step


@pytest.mark.parametrize("case", cases(3), ids=lambda c: f"P{c.percentile:g}-n{c.n_canary}")
def test_a_canary_over_a_target_the_others_miss_worse_is_promoted(case: Case) -> None:
    """The law changes levers because a target is missed: a canary still over it but below every other pod past the
    noise helps, and is promoted; one no better than them is rejected."""
    rng = np.random.default_rng(case.n_canary + 7)
    canary_ttft = case.ttft_target * rng.uniform(1.01, 2)
    better = canary_ttft * (1 + case.margin()) * 1.01
    step = judge(case, (canary_ttft, case.tpot_target / 2), (better, case.tpot_target / 2))
    assert promoted(step) and "below every other pod's" in step.state.verdict  # type: ignore[union-attr]
    step = judge(case, (canary_ttft, case.tpot_target / 2), (canary_ttft, case.tpot_target / 2))
    assert rejected(step), step


@pytest.mark.parametrize("case", cases(4), ids=lambda c: f"P{c.percentile:g}-n{c.n_canary}")
def test_a_canary_with_too_few_requests_waits_then_is_rolled_back_unjudged(case: Case) -> None:
    """Fewer than MIN_REQUESTS behind either figure, whatever they read: it waits (saying how many), and two windows
    after its reload it is rolled back, marked unjudged (its settings are not known bad)."""
    rng = np.random.default_rng(case.n_canary + 11)
    thin = int(rng.integers(0, MIN_REQUESTS))
    policy = case.policy()
    pods = {CANARY: pod(case.ttft_target * 5, case.tpot_target * 5, thin, NEW), OTHER: pod(1.0, 1.0, 500, OLD)}
    waiting = decide_rollout(state(float(rng.uniform(WINDOW_S, 2 * WINDOW_S - 1))), pods, policy, NOW)
    assert waiting.code == CANARY_WAITING and waiting.unjudged and waiting.reloads == ()
    assert f"{thin} requests with a TTFT in the canary's window, {MIN_REQUESTS} needed" in waiting.message
    ended = decide_rollout(state(2 * WINDOW_S + float(rng.uniform(0, 60))), pods, policy, NOW)
    assert rejected(ended) and ended.unjudged and ended.state is not None and ended.state.unjudged
    assert "not judged within two windows" in ended.message
    thin_tpot = PodObservation(True, p_ms=1.0, samples=500, llm=NEW, tpot_ms=1.0, tpot_samples=thin)
    step = decide_rollout(state(), {**pods, CANARY: thin_tpot}, policy, NOW)
    assert step.code == CANARY_WAITING and "with a TPOT" in step.message


def _sample_percentile(rng: np.random.Generator, n: int, floor: float, scale: float, percentile: float) -> float:
    """A pod's percentile of `n` requests of latency floor + Exp(scale), as its histogram would read it."""
    return float(np.percentile(floor + rng.exponential(scale, n), percentile))


def test_pods_on_one_setting_are_rarely_told_apart_and_a_slower_canary_is() -> None:
    """Each pod's P99 TTFT and TPOT from its own sampled requests (a floor plus an exponential tail): a canary on the
    others' distribution is rejected for noise in at most one window in ten (the bound's design: one in twenty), and a
    canary whose tail is twice theirs is rejected in nine of ten once each pod has 300 requests or more."""
    rng = np.random.default_rng(39)
    same = slower = 0
    trials = 200
    for _ in range(trials):
        n_c, n_o = int(rng.integers(300, 1500)), int(rng.integers(300, 1500))
        case = Case(ttft_target=1e9, tpot_target=1e9, percentile=99.0, n_canary=n_c, n_other=n_o)
        floor, scale = float(rng.uniform(0, 200)), float(rng.uniform(50, 400))
        others = (
            _sample_percentile(rng, n_o, floor, scale, 99),
            _sample_percentile(rng, n_o, floor / 10, scale / 10, 99),
        )
        alike = (
            _sample_percentile(rng, n_c, floor, scale, 99),
            _sample_percentile(rng, n_c, floor / 10, scale / 10, 99),
        )
        twice = (_sample_percentile(rng, n_c, floor, 2 * scale, 99), others[1])
        same += rejected(judge(case, alike, others))
        slower += rejected(judge(case, twice, others))
    assert same / trials <= 0.1, same
    assert slower / trials >= 0.9, slower


def test_the_per_pod_read_is_the_services_token_quantile_kept_apart_by_instance() -> None:
    """`prom.read_pod_generative`: one `histogram_quantile` over each pod's own buckets (by instance and le) and each
    pod's request counts, keyed by pod IP; +Inf is above every bucket, NaN (no request) no figure; the service-wide
    queries stay summed over pods."""
    from tailtune.tuner import prom

    target = prom.Target("ns", "llm", "llm")
    asked: list[str] = []
    answers = {
        "ttft_ms": [("10.0.0.1:8002", "412.5"), ("10.0.0.2:8002", "+Inf")],
        "tpot_ms": [("10.0.0.1:8002", "21"), ("10.0.0.2:8002", "NaN")],
        "ttft_requests": [("10.0.0.1:8002", "118.7"), ("10.0.0.2:8002", "0")],
        "tpot_requests": [("10.0.0.1:8002", "117")],
    }
    queries = prom.pod_generative_queries(target, 99, 95, 30)

    def query(promql: str, at: datetime) -> list[dict[str, object]]:
        asked.append(promql)
        name = next(k for k, q in queries.items() if q == promql)
        return [{"metric": {"instance": i}, "value": [at.timestamp(), v]} for i, v in answers[name]]

    pods = prom.read_pod_generative(query, target, 99, 95, 30, NOW)
    ttft_bucket = (
        f'sum by (instance, le) (increase({prom.TTFT_HISTOGRAM_MS}_bucket{{namespace="ns",model="llm"}}[30s]))'
    )
    assert asked[0] == f"histogram_quantile(0.99, {ttft_bucket})"
    assert "histogram_quantile(0.95, sum by (instance, le)" in asked[1] and prom.TPOT_HISTOGRAM_MS in asked[1]
    assert pods["10.0.0.1"] == prom.PodTokenWindow(412.5, 21.0, 118.7, 117.0)
    assert pods["10.0.0.2"] == prom.PodTokenWindow(None, None, 0.0, None, above_range_ttft=True)
    service = prom.generative_queries(target, 99, 95, 30)["ttft_ms"]
    assert "sum by (le) (increase(" in service and "instance" not in service

"""The model's bytes: which ones the engine was built from, how to rebuild after replacing them at the same URI,
and how to retry a failed build (issue 40, item 5).

Like an image tag, an unpinned `spec.model.uri` is read once; `spec.model.sha256` pins the bytes like a digest;
`spec.model.revision` names a new version of the file at the same URI and so a new engine.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime

import pytest

from tailtune.api.v1alpha1 import EngineStatus, InferenceServiceStatus
from tailtune.engine_builder.cli import build_report
from tailtune.operator import status as st
from tailtune.operator.engine import engine_cache_key, engine_info, engine_status, parse_build_report
from tailtune.operator.observed import DeploymentObservation, JobObservation, Observed
from tailtune.operator.reconcile import reconcile
from tests.unit.factories import make_isvc
from tests.unit.operator.test_reconcile import RecordingCluster, _with_status

NOW = datetime(2026, 1, 1, tzinfo=UTC)
OLD = "sha256:" + "a" * 64
NEW = "sha256:" + "b" * 64
PIN = "c" * 64


def _report(digest: str) -> str:
    """A builder's success report (its termination message) for a build that read bytes of `digest`."""
    metadata = {
        "cacheKey": "eng-1",
        "artifact": "demo/1/model.plan",
        "modelDigest": digest,
        "inputs": [{"name": "x", "dtype": "TYPE_FP32", "dims": [-1, 16]}],
        "outputs": [{"name": "y", "dtype": "TYPE_FP32", "dims": [-1, 4]}],
    }
    return build_report(metadata, "eng-1 built in 3 s")


def _engine_ready(status: InferenceServiceStatus) -> tuple[str, str, str]:
    c = next(c for c in status.conditions if c.type == st.ENGINE_READY)
    return c.status, c.reason, c.message


# --- which bytes the engine was built from --------------------------------------------------------------------


def test_the_build_reports_the_digest_it_read_and_status_records_it() -> None:
    info = parse_build_report(_report(OLD))
    assert info is not None and info.model_digest == OLD
    recorded = engine_status("eng-1", "tailtune-engines", info, EngineStatus())
    assert recorded.model_digest == OLD
    # Kept from status once the Job is gone (no report to read any more).
    isvc = make_isvc().obj()
    key = engine_cache_key(isvc)
    kept = make_isvc().set(
        "status", {"engine": engine_status(key, "s", info, EngineStatus()).model_dump(by_alias=True)}
    )
    again = engine_info(kept.obj(), key, None)
    assert again is not None and again.model_digest == OLD
    # A malformed digest is no digest (never fatal).
    assert parse_build_report(_report("md5:abc")).model_digest is None  # type: ignore[union-attr]


def test_engine_built_names_the_digest_and_how_to_rebuild() -> None:
    engine = EngineStatus(job_name="eng-1", model_digest=OLD)
    c = st.compute_engine_condition(make_isvc().obj(), Observed(job=JobObservation(succeeded=True)), engine=engine)
    assert (c.status, c.reason) == ("True", st.ENGINE_BUILT)
    assert f"from model {OLD}" in c.message
    assert "spec.model.revision" in c.message and "not read again" in c.message
    pinned = make_isvc().set("spec.model.sha256", PIN).obj()
    c = st.compute_engine_condition(pinned, Observed(job=JobObservation(succeeded=True)), engine=EngineStatus())
    assert c.message == f"engine built and stored, from model sha256:{PIN} (pinned by spec.model.sha256)"


# --- a model replaced at the same URI --------------------------------------------------------------------------


def test_a_new_revision_is_a_new_engine_and_no_revision_keeps_the_key() -> None:
    base = engine_cache_key(make_isvc().obj())
    assert base == "eng-e98c7892006be524"  # keys made before spec.model.revision existed do not move
    first = engine_cache_key(make_isvc().set("spec.model.revision", "2026-01-05").obj())
    second = engine_cache_key(make_isvc().set("spec.model.revision", "2026-02-01").obj())
    assert len({base, first, second}) == 3
    assert first == engine_cache_key(make_isvc().set("spec.model.revision", "2026-01-05").obj())


def test_a_model_replaced_at_the_same_uri_is_rebuilt_when_the_revision_changes() -> None:
    # Built and serving from the old bytes.
    served = Observed(
        job=JobObservation(succeeded=True, message=_report(OLD)),
        deployment=DeploymentObservation(replicas=1, ready_replicas=1),
    )
    cluster = RecordingCluster(served)
    raw = make_isvc().dict()
    asyncio.run(reconcile(raw, cluster, NOW))
    built = cluster.statuses[-1]
    assert built.engine.model_digest == OLD
    assert OLD in _engine_ready(built)[2]
    old_key = built.engine.cache_key

    # The file at the URI is replaced and the user sets a new revision, as EngineBuilt's message says.
    cluster.observed = Observed(deployment=DeploymentObservation(replicas=1, ready_replicas=1))  # no Job of the new key
    cluster.applied.clear()
    revised = _with_status(make_isvc().set("spec.model.revision", "v2").dict(), built)
    asyncio.run(reconcile(revised, cluster, NOW))
    [job] = [m for m in cluster.applied if m["kind"] == "Job"]
    assert job["metadata"]["name"] != old_key
    assert _engine_ready(cluster.statuses[-1])[:2] == ("False", st.ENGINE_BUILD_RUNNING)

    # The new build read the new bytes: status says so.
    cluster.observed = Observed(
        job=JobObservation(succeeded=True, message=_report(NEW)),
        deployment=DeploymentObservation(replicas=1, ready_replicas=1),
    )
    asyncio.run(reconcile(_with_status(revised, cluster.statuses[-1]), cluster, NOW))
    rebuilt = cluster.statuses[-1]
    assert rebuilt.engine.model_digest == NEW and rebuilt.engine.cache_key == job["metadata"]["name"]
    assert NEW in _engine_ready(rebuilt)[2]


# --- a failed build: how to retry -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "termination", "needles"),
    [
        ({}, "CorruptModel: model.onnx: not a valid ONNX model",
         ["kubectl delete job -n ml eng-1", "spec.model.revision"]),
        ({"spec.model.sha256": PIN}, "CorruptModel: model.onnx: protobuf decode error",
         ["kubectl delete job -n ml eng-1", "spec.model.sha256"]),
        ({"spec.model.sha256": PIN}, f"DigestMismatch: https://m/x.onnx has sha256 {'d' * 64}, expected {PIN}",
         ["set spec.model.sha256 to their digest", "restore the file, then `kubectl delete job -n ml eng-1`"]),
    ],
)  # fmt: skip
def test_a_failed_build_says_exactly_how_to_retry(spec: dict[str, str], termination: str, needles: list[str]) -> None:
    builder = make_isvc(namespace="ml")
    for path, value in spec.items():
        builder = builder.set(path, value)
    job = JobObservation(failed=True, message=termination)
    c = st.compute_engine_condition(builder.obj(), Observed(job=job), engine=EngineStatus(job_name="eng-1"))
    assert c.reason == st.ENGINE_BUILD_FAILED and termination in c.message
    for needle in needles:
        assert needle in c.message, c.message


def test_deleting_the_failed_job_as_told_builds_the_same_key_again() -> None:
    cluster = RecordingCluster(Observed(job=JobObservation(failed=True, message="CorruptModel: truncated file")))
    raw = make_isvc(namespace="ml").dict()
    asyncio.run(reconcile(raw, cluster, NOW))
    failed = cluster.statuses[-1]
    key = failed.engine.cache_key
    command = re.search(r"`(kubectl delete job [^`]+)`", _engine_ready(failed)[2])
    assert command is not None and command.group(1) == f"kubectl delete job -n ml {key}"
    assert cluster.applied == []  # the failed Job stays: never rebuilt on its own
    cluster.observed = Observed()  # the user ran it: the Job is gone
    asyncio.run(reconcile(_with_status(raw, failed), cluster, NOW))
    assert [(m["kind"], m["metadata"]["name"]) for m in cluster.applied] == [("Job", key)]

"""The real API server judges spec.engine.llm and spec.serving.llm by the CRD's CEL rules and schema, as the
pydantic models do (tests/unit/operator/test_trtllm_spec.py): server-side dry runs, nothing created."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.e2e.test_operator import _set, example

if TYPE_CHECKING:
    from tests.e2e.conftest import Cluster

GENERATIVE = {
    "spec.model.kind": "generative",
    "spec.slo.ttft": {"targetMs": 500, "percentile": 99},
    "spec.slo.tpot": {"targetMs": 30, "percentile": 99},
}


def _dry_run(cluster: Cluster, changes: dict[str, Any]) -> tuple[int, str]:
    doc = copy.deepcopy(example("llm"))
    for path, value in changes.items():
        _set(doc, path, value)
    result = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False)
    return result.returncode, result.stderr


INVALID = [
    ("llm fields on a request model", {"spec.serving.llm": {"maxQueueSize": 8}},
     "spec.engine.llm and spec.serving.llm apply to generative services only"),
    ("seq not above input", {**GENERATIVE, "spec.engine.llm": {"maxInputLen": 2048, "maxSeqLen": 2048}},
     "engine.llm.maxSeqLen must be > engine.llm.maxInputLen"),
    ("prompt above the token budget", {**GENERATIVE, "spec.engine.llm": {"maxNumTokens": 512, "maxInputLen": 1024}},
     "spec.engine.llm.maxNumTokens must be >= spec.engine.llm.maxInputLen unless"),
    ("tensor parallel 2", {**GENERATIVE, "spec.engine.llm": {"tensorParallel": 2}},
     'spec.engine.llm.tensorParallel: Unsupported value: 2'),
    ("kv fraction 1", {**GENERATIVE, "spec.serving.llm": {"kvCacheFreeGpuMemFraction": 1}},
     "spec.serving.llm.kvCacheFreeGpuMemFraction"),
    ("static batch policy", {**GENERATIVE, "spec.serving.llm": {"batchSchedulerPolicy": "static_batch"}},
     'spec.serving.llm.batchSchedulerPolicy: Unsupported value: "static_batch"'),
    ("generative on onnxruntime", {**GENERATIVE, "spec.engine.backend": "onnxruntime", "spec.engine.precision": "fp32"},
     "spec.model.kind generative builds a TensorRT-LLM engine"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "changes", "message"), INVALID, ids=[c[0] for c in INVALID])
def test_admission_refuses_bad_llm_fields(
    cluster: Cluster, crd_installed: list[str], case: str, changes: dict[str, Any], message: str
) -> None:
    code, stderr = _dry_run(cluster, changes)
    assert code != 0, f"{case}: accepted"
    assert message in stderr, stderr


@pytest.mark.parametrize(
    "changes",
    [
        GENERATIVE,
        {**GENERATIVE, "spec.engine.llm": {"maxNumTokens": 512, "maxInputLen": 4096, "maxSeqLen": 8192},
         "spec.serving.llm": {"enableChunkedContext": True, "batchSchedulerPolicy": "max_utilization"}},
    ],
    ids=["defaults", "chunked-context"],
)  # fmt: skip
def test_admission_accepts_good_llm_fields(cluster: Cluster, crd_installed: list[str], changes: dict[str, Any]) -> None:
    """The has() guards do not refuse what they should let through (an unset llm, chunked context)."""
    code, stderr = _dry_run(cluster, changes)
    assert code == 0, stderr

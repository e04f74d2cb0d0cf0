"""Pure builders: exact equality against reviewed golden manifests, plus the properties that matter."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tailtune.operator.builders.engine_job import build_engine_job
from tailtune.operator.builders.triton import build_deployment, build_model_configmap, build_service
from tailtune.operator.observed import JobObservation, Observed
from tailtune.operator.reconcile import desired_state
from tests.unit.factories import make_isvc

GOLDEN = Path(__file__).parent / "golden"


def _golden(name: str, manifest: dict[str, Any]) -> None:
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(manifest, sort_keys=True))
    assert manifest == yaml.safe_load(path.read_text())


def test_engine_job_golden() -> None:
    _golden("engine-job", build_engine_job(make_isvc().obj(), "eng-0123456789abcdef"))


def test_deployment_golden() -> None:
    isvc = make_isvc().obj()
    _golden("deployment", build_deployment(isvc, cache_key="eng-0123456789abcdef", replicas=2, config_digest="d1"))


def test_service_golden() -> None:
    _golden("service", build_service(make_isvc().obj()))


def test_configmap_golden() -> None:
    _golden("configmap", build_model_configmap(make_isvc().obj(), 'name: "demo"\n'))


def test_engine_job_runs_on_the_serving_gpu_product() -> None:
    isvc = make_isvc().gpu("NVIDIA-H100-80GB-HBM3", 2).obj()
    pod = build_engine_job(isvc, "eng-k")["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert "--cache-key" in pod["containers"][0]["command"]


def test_pvc_model_uri_is_mounted_read_only() -> None:
    isvc = make_isvc().set("spec.model.uri", "pvc://models/bert/model.onnx").obj()
    pod = build_engine_job(isvc, "eng-k")["spec"]["template"]["spec"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pod["volumes"]


def test_deployment_requests_gpus_and_probes_model_ready() -> None:
    isvc = make_isvc().gpu("NVIDIA-L4", 2).obj()
    container = build_deployment(isvc, cache_key="eng-k", replicas=1, config_digest="x")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/models/demo/ready"
    assert "--model-control-mode=explicit" in container["args"]


def test_deployment_rolls_one_pod_at_a_time_without_losing_capacity() -> None:
    spec = build_deployment(make_isvc().obj(), cache_key="eng-k", replicas=1, config_digest="x")["spec"]
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


def _objects(builder: Any) -> dict[str, dict[str, Any]]:
    desired = desired_state(builder.obj(), Observed(job=JobObservation(succeeded=True)))
    return {o["kind"]: o for o in desired.objects}


def _hash(objs: dict[str, dict[str, Any]]) -> str:
    value: str = objs["Deployment"]["spec"]["template"]["metadata"]["annotations"]["tailtune.io/config-hash"]
    return value


@pytest.mark.parametrize(("mode", "rolls"), [("hot", False), ("rolling", True)])
def test_tuner_batching_rolls_pods_only_in_rolling_mode(mode: str, rolls: bool) -> None:
    base = make_isvc().set("spec.tuning.mode", mode)
    tuned = (
        make_isvc()
        .set("spec.tuning.mode", mode)
        .annotate("tailtune.io/applied", '{"batching": {"maxBatchSize": 16}, "replicas": 1}')
    )
    before, after = _objects(base), _objects(tuned)
    assert "max_batch_size: 16" in after["ConfigMap"]["data"]["config.pbtxt"]
    assert (_hash(before) != _hash(after)) is rolls


def test_user_batching_change_rolls_in_hot_mode_too() -> None:
    before = _objects(make_isvc())
    after = _objects(make_isvc().set("spec.serving.batching", {"maxBatchSize": 4}))
    assert _hash(before) != _hash(after)


def test_no_serving_objects_before_the_engine() -> None:
    desired = desired_state(make_isvc().obj(), Observed())
    assert [o["kind"] for o in desired.objects] == ["Job"]
    running = desired_state(make_isvc().obj(), Observed(job=JobObservation()))  # exists, not finished
    assert running.objects == []


def test_engine_io_unknown_blocks_serving_with_a_reason() -> None:
    raw = make_isvc()
    del raw.raw["spec"]["model"]["inputs"]
    desired = desired_state(raw.obj(), Observed(job=JobObservation(succeeded=True)))
    assert desired.objects == []
    assert desired.serving_problem is not None and desired.serving_problem[0] == "EngineIOUnknown"


def test_build_report_supplies_io() -> None:
    raw = make_isvc()
    del raw.raw["spec"]["model"]["inputs"]
    del raw.raw["spec"]["model"]["outputs"]
    report = (
        '{"inputs": [{"name": "a", "dataType": "TYPE_FP16", "dims": [8]}],'
        ' "outputs": [{"name": "b", "dataType": "TYPE_FP16", "dims": [2]}], "tensorrtVersion": "10.8.0"}'
    )
    desired = desired_state(raw.obj(), Observed(job=JobObservation(succeeded=True, message=report)))
    text = next(o for o in desired.objects if o["kind"] == "ConfigMap")["data"]["config.pbtxt"]
    assert 'name: "a"' in text and "TYPE_FP16" in text
    assert desired.engine_info is not None and desired.engine_info.tensorrt_version == "10.8.0"


def test_the_builders_success_report_is_what_the_operator_reads() -> None:
    from tailtune.engine_builder.cli import build_report
    from tailtune.operator.engine import parse_build_report

    metadata = {
        "cacheKey": "eng-1",
        "artifact": "demo/1/model.plan",
        "tensorrtVersion": "10.8.0.43",
        "gpu": {"product": "NVIDIA-L4", "name": "NVIDIA L4", "computeCapability": "8.9"},
        "inputs": [{"name": "x", "dtype": "TYPE_FP16", "onnxDtype": "FLOAT16", "dims": [-1, 3, 224, 224]}],
        "outputs": [{"name": "y", "dtype": "TYPE_FP16", "onnxDtype": "FLOAT16", "dims": [-1, 1000]}],
    }
    info = parse_build_report(build_report(metadata, "eng-1 built in 41 s"))
    assert info is not None
    assert (info.tensorrt_version, info.gpu_product, info.location) == ("10.8.0.43", "NVIDIA-L4", "demo/1/model.plan")
    assert [(t.name, t.data_type, t.dims) for t in info.inputs] == [("x", "TYPE_FP16", [3, 224, 224])]
    assert [(t.name, t.dims) for t in info.outputs] == [("y", [1000])]
    assert parse_build_report("EngineBuildFailed: boom") is None


def test_a_triton_pod_serves_on_until_its_endpoint_is_dropped_and_drains_within_its_grace() -> None:
    """Caught: without a preStop sleep a scale-in's pod began refusing requests while clients still picked it; a grace
    period shorter than the sleep plus Triton's exit timeout would SIGKILL the in-flight generations."""
    from tailtune.operator.builders.triton import ENDPOINT_PROPAGATION_S, TRITON_EXIT_TIMEOUT_S

    pod = build_deployment(make_isvc().obj(), cache_key="eng-0", replicas=1, config_digest="d")["spec"]["template"]
    (triton,) = pod["spec"]["containers"]
    assert triton["lifecycle"]["preStop"] == {"sleep": {"seconds": ENDPOINT_PROPAGATION_S}}
    assert pod["spec"]["terminationGracePeriodSeconds"] >= ENDPOINT_PROPAGATION_S + TRITON_EXIT_TIMEOUT_S

"""The operator as a real process against the real local API server (kwok GPU nodes)."""

from __future__ import annotations

import copy
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

if TYPE_CHECKING:
    from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "resnet-l4.yaml"


class OperatorProcess:
    """`tailtune operator` in a subprocess, logging to a file; can be killed and restarted."""

    def __init__(
        self, cluster: Cluster, log_path: Path, extra_env: dict[str, str] | None = None, args: tuple[str, ...] = ()
    ) -> None:
        self.cluster = cluster
        self.log_path = log_path
        self.extra_env = extra_env or {}
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.log_path.open("ab")
        env = {**self.cluster.env, **self.extra_env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tailtune", "operator", *self.args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 60) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        return "\n".join(lines[-n:])


def engine_store(cluster: Cluster, namespace: str) -> None:
    """A bound PersistentVolumeClaim `tailtune-engines` (the engine store) in the namespace."""
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"engines-{namespace}"},
        "spec": {
            "capacity": {"storage": "10Gi"},
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "hostPath": {"path": f"/tmp/tailtune-e2e/{namespace}"},
            "claimRef": {"namespace": namespace, "name": "tailtune-engines"},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "tailtune-engines", "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": f"engines-{namespace}",
            "resources": {"requests": {"storage": "10Gi"}},
        },
    }
    cluster.apply(pv, pvc)


# Spec changes the tests make: two replicas (a scale, no reload), max batch 4 (a serving change, no new build).
SCALE_TO_TWO = '{"spec": {"serving": {"replicas": {"min": 2, "max": 4}}}}'
BATCH_OF_FOUR = (
    '{"spec": {"serving": {"batching": {"maxBatchSize": 4, "preferredBatchSizes": [4]}},'
    ' "warmup": {"batchSizes": [1, 4]}}}'
)


def example(name: str = "resnet50") -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = name
    return doc


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    if not obj:
        return None
    for c in obj.get("status", {}).get("conditions", []):
        if c["type"] == type_:
            found: dict[str, Any] = c
            return found
    return None


def wait_condition(
    cluster: Cluster, op: OperatorProcess, namespace: str, name: str, type_: str, status: str,
    reason: str | None = None, timeout_s: float = 90,
) -> dict[str, Any]:  # fmt: skip
    def check() -> dict[str, Any] | None:
        c = condition(cluster.get("tis", name, namespace), type_)
        if c and c["status"] == status and (reason is None or c["reason"] == reason):
            return c
        return None

    try:
        return cluster.wait_for(f"{type_}={status} {reason or ''} on {namespace}/{name}", check, timeout_s)
    except BaseException:
        print("operator log:\n" + op.log_tail(), file=sys.stderr)
        print("tis:\n" + yaml.safe_dump(cluster.get("tis", name, namespace)), file=sys.stderr)
        raise


def parse_table(text: str) -> list[dict[str, str]]:
    """kubectl's column output, cut at the header's column starts (empty cells stay empty)."""
    lines = text.splitlines()
    header = lines[0]
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    names = [header[a:b].strip() for a, b in bounds]
    return [{n: line[a:b].strip() for n, (a, b) in zip(names, bounds, strict=True)} for line in lines[1:]]


def jobs(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = cluster.get("jobs", namespace=namespace)["items"]
    return found


# ------------------------------------------------------------------------------------------ admission

INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("tuning max above engine max", {"spec.tuning.maxBatchSize": {"min": 1, "max": 64}},
     "tuning.maxBatchSize.max must be <= engine.optimizationProfile.max"),
    ("serving batch above engine max", {"spec.serving.batching": {"maxBatchSize": 64}},
     "serving.batching.maxBatchSize must be <= engine.optimizationProfile.max"),
    ("preferred above max batch", {"spec.serving.batching": {"maxBatchSize": 4, "preferredBatchSizes": [8]}},
     "every preferredBatchSizes entry must be <= maxBatchSize"),
    ("replicas min above max", {"spec.serving.replicas": {"min": 3, "max": 2}}, "replicas.min must be <= replicas.max"),
    ("int8 without calibration", {"spec.engine.precision": "int8"}, "precision int8 needs engine.calibrationCacheUri"),
    ("onnxruntime bf16", {"spec.engine.backend": "onnxruntime", "spec.engine.precision": "bf16"},
     "backend onnxruntime serves the ONNX model as it is: set engine.precision to fp32"),
    ("profile opt above max", {"spec.engine.optimizationProfile": {"opt": 64, "max": 32}},
     "optimizationProfile.opt must be <= optimizationProfile.max"),
    ("warmup batch above max batch", {"spec.warmup.batchSizes": [16]},
     "every warmup.batchSizes entry must be <= serving.batching.maxBatchSize"),
    ("ftp uri", {"spec.model.uri": "ftp://example.com/m.onnx"}, "spec.model.uri"),
    ("zero latency", {"spec.slo.latencyMs": 0}, "spec.slo.latencyMs"),
    ("percentile above 99.99", {"spec.slo.percentile": 100}, "spec.slo.percentile"),
    ("unknown precision", {"spec.engine.precision": "fp4"}, 'spec.engine.precision: Unsupported value: "fp4"'),
    ("unknown tuning mode", {"spec.tuning.mode": "yolo"}, 'spec.tuning.mode: Unsupported value: "yolo"'),
    ("missing gpu product", {"spec.serving.gpu": {"count": 1}}, "spec.serving.gpu.product: Required value"),
    ("bad sha256", {"spec.model.sha256": "xyz"}, "spec.model.sha256"),
    ("tuning delay range inverted", {"spec.tuning.queueDelayMicroseconds": {"min": 500, "max": 100}},
     "min must be <= max"),
    ("blank builder image", {"spec.engine.builderImage": " "}, "engine.builderImage must be an image reference"),
    ("tuning preferred above tuning max", {"spec.tuning.preferredBatchSizes": [4, 64]},
     "every tuning.preferredBatchSizes entry must be <= tuning.maxBatchSize.max"),
    ("tuning delay above 1 s", {"spec.tuning.queueDelayMicroseconds": {"min": 0, "max": 5_000_000}},
     "tuning.queueDelayMicroseconds.max must be <= 1000000"),
    ("generative without token targets", {"spec.model.kind": "generative", "spec.slo.ttft": {"targetMs": 500}},
     "spec.model.kind generative needs spec.slo.ttft and spec.slo.tpot"),
    ("token targets on a request service", {"spec.slo.tpot": {"targetMs": 30, "percentile": 99}},
     "spec.slo.ttft and spec.slo.tpot apply to generative services only"),
]  # fmt: skip


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    node = doc
    *parents, leaf = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value


@pytest.mark.parametrize(("case", "changes", "message"), INVALID, ids=[c[0] for c in INVALID])
def test_admission_rejects_invalid_specs(
    cluster: Cluster, crd_installed: list[str], case: str, changes: dict[str, Any], message: str
) -> None:
    doc = copy.deepcopy(example("bad"))
    for path, value in changes.items():
        _set(doc, path, value)
    result = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert result.returncode != 0, f"{case}: accepted"
    assert message in result.stderr, result.stderr


def test_admission_accepts_a_generative_spec(cluster: Cluster, crd_installed: list[str]) -> None:
    """A generative spec with both token targets passes the CEL rules that refuse the cases above (caught: a rule
    whose has() guards were wrong would refuse every generative spec or let every one through)."""
    doc = copy.deepcopy(example("generative"))
    _set(doc, "spec.model.kind", "generative")
    _set(doc, "spec.slo.ttft", {"targetMs": 500, "percentile": 99})
    _set(doc, "spec.slo.tpot", {"targetMs": 30, "percentile": 99.9})
    result = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------------------------------ lifecycle


def test_example_becomes_ready_on_an_l4_node(cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    engine_store(cluster, namespace)
    cluster.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))
    wait_condition(cluster, operator, namespace, "resnet50", "EngineReady", "True")
    wait_condition(cluster, operator, namespace, "resnet50", "Ready", "True")

    [job] = jobs(cluster, namespace)
    tis = cluster.get("tis", "resnet50", namespace)
    assert job["metadata"]["name"] == tis["status"]["engine"]["cacheKey"]
    pods = cluster.get("pods", namespace=namespace)["items"]
    triton = [p for p in pods if p["metadata"]["labels"].get("app.kubernetes.io/component") == "triton"]
    assert triton, "no Triton pods"
    for pod in triton:
        node = cluster.get("node", pod["spec"]["nodeName"])
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert tis["status"]["observedGeneration"] == tis["metadata"]["generation"]
    assert tis["status"]["endpoints"]["http"] == f"http://resnet50.{namespace}.svc:8000"
    cm = cluster.get("configmap", "resnet50-triton-config", namespace)
    assert "max_batch_size: 8" in cm["data"]["config.pbtxt"]

    table = parse_table(cluster.kubectl("get", "tis", "-n", namespace).stdout)
    assert list(table[0]) == ["NAME", "READY", "SLO", "P99", "BATCH", "DELAY", "REPLICAS", "AGE"]
    row = table[0]
    assert (row["NAME"], row["READY"], row["SLO"], row["BATCH"], row["DELAY"], row["REPLICAS"]) == (
        "resnet50", "True", "30", "8", "500", "1",
    )  # fmt: skip
    assert row["P99"] == ""  # no Prometheus here: no latency yet, and nothing made up


def test_unknown_gpu_product_says_so(cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    engine_store(cluster, namespace)
    doc = example("nogpu")
    doc["spec"]["serving"]["gpu"]["product"] = "NVIDIA-B200"
    cluster.apply(doc, namespace=namespace)
    c = wait_condition(cluster, operator, namespace, "nogpu", "Ready", "False", "EngineBuildUnschedulable")
    assert "NVIDIA-B200" in c["message"]
    pods = cluster.get("pods", namespace=namespace)["items"]
    assert pods and all(p["status"]["phase"] == "Pending" for p in pods)


def test_failed_build_reports_the_message(cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    engine_store(cluster, namespace)
    doc = example("broken")
    doc["spec"]["engine"]["podAnnotations"] = {"kwok.tailtune.io/fail": "model digest mismatch: got ab12, want cd34"}
    doc["spec"]["engine"]["backoffLimit"] = 0
    cluster.apply(doc, namespace=namespace)
    c = wait_condition(cluster, operator, namespace, "broken", "EngineReady", "False", "EngineBuildFailed")
    assert "model digest mismatch: got ab12, want cd34" in c["message"]
    assert condition(cluster.get("tis", "broken", namespace), "Ready")["status"] == "False"  # type: ignore[index]
    assert cluster.get("deployment", "broken-triton", namespace) is None


def test_serving_change_rolls_without_a_new_build(cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    engine_store(cluster, namespace)
    cluster.apply(example(), namespace=namespace)
    wait_condition(cluster, operator, namespace, "resnet50", "Ready", "True")
    before = cluster.get("deployment", "resnet50-triton", namespace)
    cluster.kubectl("patch", "tis", "resnet50", "-n", namespace, "--type=merge", "-p", BATCH_OF_FOUR)

    def rolled() -> dict[str, Any] | None:
        dep = cluster.get("deployment", "resnet50-triton", namespace)
        return dep if dep["metadata"]["generation"] > before["metadata"]["generation"] else None

    after = cluster.wait_for("the Deployment to roll", rolled, 60)
    key = "tailtune.io/config-hash"
    assert (
        after["spec"]["template"]["metadata"]["annotations"][key]
        != before["spec"]["template"]["metadata"]["annotations"][key]
    )
    assert len(jobs(cluster, namespace)) == 1
    cm = cluster.get("configmap", "resnet50-triton-config", namespace)
    assert "max_batch_size: 4" in cm["data"]["config.pbtxt"]


def test_engine_change_builds_a_new_engine(cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    engine_store(cluster, namespace)
    cluster.apply(example(), namespace=namespace)
    wait_condition(cluster, operator, namespace, "resnet50", "Ready", "True")
    first = [j["metadata"]["name"] for j in jobs(cluster, namespace)]
    cluster.kubectl("patch", "tis", "resnet50", "-n", namespace, "--type=merge", "-p",
                    '{"spec": {"engine": {"precision": "fp32"}}}')  # fmt: skip

    def rebuilt() -> str | None:
        tis = cluster.get("tis", "resnet50", namespace)
        key: str = tis["status"]["engine"]["cacheKey"]
        ready = condition(tis, "Ready")
        return key if key not in first and ready and ready["status"] == "True" else None

    key = cluster.wait_for("Ready on the new engine", rebuilt, 90)
    dep = cluster.get("deployment", "resnet50-triton", namespace)
    assert dep["spec"]["template"]["metadata"]["annotations"]["tailtune.io/engine-key"] == key
    # The earlier spec's build is of no use once the new engine is Ready: its Job goes.
    cluster.wait_for(
        "the obsolete build Job deleted", lambda: [j["metadata"]["name"] for j in jobs(cluster, namespace)] == [key], 20
    )
    assert all(j["spec"]["ttlSecondsAfterFinished"] > 0 for j in jobs(cluster, namespace))


def test_delete_garbage_collects_children(cluster: Cluster, operator: OperatorProcess, namespace: str) -> None:
    engine_store(cluster, namespace)
    cluster.apply(example(), namespace=namespace)
    wait_condition(cluster, operator, namespace, "resnet50", "Ready", "True")
    cluster.kubectl("delete", "tis", "resnet50", "-n", namespace)

    def gone() -> bool:
        return all(
            cluster.get(kind, name, namespace) is None
            for kind, name in [("deployment", "resnet50-triton"), ("service", "resnet50"),
                               ("configmap", "resnet50-triton-config")]
        ) and not jobs(cluster, namespace)  # fmt: skip

    cluster.wait_for("children garbage-collected", gone, 90)


def test_operator_killed_mid_reconcile_converges_without_duplicates(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    engine_store(cluster, namespace)
    cluster.apply(example(), namespace=namespace)
    cluster.wait_for("the build Job", lambda: jobs(cluster, namespace), 30)
    operator.kill()
    time.sleep(1)
    operator.start()
    wait_condition(cluster, operator, namespace, "resnet50", "Ready", "True")
    operator.kill()
    operator.start()
    time.sleep(5)
    assert len(jobs(cluster, namespace)) == 1
    deployments = cluster.get("deployments", namespace=namespace)["items"]
    assert [d["metadata"]["name"] for d in deployments] == ["resnet50-triton"]
    assert condition(cluster.get("tis", "resnet50", namespace), "Ready")["status"] == "True"  # type: ignore[index]
    assert operator.alive()


def test_operator_only_judged_spec_sets_invalid_spec(
    cluster: Cluster, operator: OperatorProcess, namespace: str
) -> None:
    doc = example("gpuinres")
    doc["spec"]["serving"]["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
    cluster.apply(doc, namespace=namespace)
    c = wait_condition(cluster, operator, namespace, "gpuinres", "Ready", "False", "InvalidSpec")
    assert "spec.serving.gpu.count" in c["message"]
    assert jobs(cluster, namespace) == []
    rv = cluster.get("tis", "gpuinres", namespace)["metadata"]["resourceVersion"]
    time.sleep(3)
    assert cluster.get("tis", "gpuinres", namespace)["metadata"]["resourceVersion"] == rv, "status rewritten in a loop"
    assert operator.alive()

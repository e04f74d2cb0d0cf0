"""Scale benchmark: N InferenceServices applied at once against the real local cluster.

Measures the time until all are Ready, the operator's CPU seconds and peak RSS, API requests per resource
(the apiserver's own `apiserver_request_total`), and steady-state requests per minute once all are Ready,
over two consecutive windows (the second must not be larger: no hot loops). Writes bench/out/scale/.

Run: .venv/bin/python bench/scale/bench_scale.py [--count 200] [--steady-seconds 120]
Needs a running cluster (`python hack/cluster/cluster.py up`; KUBECONFIG from `cluster.py env`) or starts one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "out" / "scale"
NAMESPACE = "scale-bench"


def sh(*args: str, input: str | None = None, check: bool = True) -> str:
    result = subprocess.run(args, input=input, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {result.stderr}")
    return result.stdout


def cluster_env() -> dict[str, str]:
    out = sh(sys.executable, str(ROOT / "hack/cluster/cluster.py"), "up")
    del out
    env_text = sh(sys.executable, str(ROOT / "hack/cluster/cluster.py"), "env")
    env = dict(os.environ)
    for line in env_text.splitlines():
        if line.startswith("export "):
            for assignment in line.removeprefix("export ").split():
                key, _, value = assignment.partition("=")
                env[key] = value.strip("'\"").replace("$PATH", env.get("PATH", ""))
    return env


def kubectl(env: dict[str, str], *args: str, input: str | None = None, check: bool = True) -> str:
    result = subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True, env=env, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr}")
    return result.stdout


Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def samples(text: str) -> Samples:
    """A Prometheus text page (the API server's, the operator's, Prometheus' own): sample name -> labels -> value."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def request_counts(env: dict[str, str]) -> Counter[tuple[str, str]]:
    """apiserver_request_total summed by (resource, verb)."""
    counts: Counter[tuple[str, str]] = Counter()
    for labels, value in samples(kubectl(env, "get", "--raw", "/metrics")).get("apiserver_request_total", {}).items():
        found = dict(labels)
        counts[(found.get("resource", ""), found.get("verb", ""))] += int(value)
    return counts


def gpu_nodes(count: int) -> list[dict[str, Any]]:
    """Extra kwok L4 nodes so that every serving pod finds a GPU."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": f"scale-l4-{i}",
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {"nvidia.com/gpu.product": "NVIDIA-L4", "kubernetes.io/hostname": f"scale-l4-{i}",
                           "type": "kwok"},
            },
            "spec": {"taints": []},
            "status": {
                "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
                "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"},
            },
        }
        for i in range(count)
    ]  # fmt: skip


def isvc(i: int) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples/resnet-l4.yaml").read_text())
    doc["metadata"] = {"name": f"svc-{i:03d}", "namespace": NAMESPACE}
    doc["spec"]["model"]["sha256"] = hashlib.sha256(str(i).encode()).hexdigest()  # a build Job each
    doc["spec"]["serving"]["replicas"] = {"min": 1, "max": 1}
    doc["spec"]["metrics"] = {"prometheusUrl": "http://127.0.0.1:9"}  # no Prometheus: the tuner must hold quietly
    return doc


def proc_stats(pid: int) -> tuple[float, int]:
    """(CPU seconds, peak RSS bytes) of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    hwm = next(int(x.split()[1]) * 1024 for x in Path(f"/proc/{pid}/status").read_text().splitlines()
               if x.startswith("VmHWM"))  # fmt: skip
    return cpu, hwm


def ready_count(env: dict[str, str]) -> int:
    data = json.loads(kubectl(env, "get", "tis", "-n", NAMESPACE, "-o", "json"))
    return sum(
        any(c["type"] == "Ready" and c["status"] == "True" for c in item.get("status", {}).get("conditions", []))
        for item in data["items"]
    )


def engine_store(env: dict[str, str], namespace: str, pv_name: str) -> None:
    """A bound PersistentVolumeClaim `tailtune-engines` (the engine store) in the namespace, on a hostPath PV."""
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "1Ti"},
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "hostPath": {"path": f"/tmp/tailtune-{pv_name}"},
            "claimRef": {"namespace": namespace, "name": "tailtune-engines"},
        },
    }
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": "tailtune-engines", "namespace": namespace},
           "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv_name,
                    "resources": {"requests": {"storage": "1Ti"}}}}  # fmt: skip
    kubectl(env, "delete", "pv", pv_name, "--ignore-not-found")  # a Released PV from an earlier run
    kubectl(env, "apply", "-f", "-", input=yaml.safe_dump_all([pv, pvc]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--steady-seconds", type=int, default=120)
    parser.add_argument("--timeout", type=int, default=1200)
    args = parser.parse_args()
    env = cluster_env()
    kubectl(env, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    kubectl(env, "apply", "-f", "-", input=yaml.safe_dump_all(gpu_nodes((args.count + 7) // 8 + 1)))
    kubectl(env, "create", "namespace", NAMESPACE, check=False)
    engine_store(env, NAMESPACE, "scale-engines")
    OUT.mkdir(parents=True, exist_ok=True)
    log = (OUT / "operator.log").open("w")
    op = subprocess.Popen([sys.executable, "-m", "tailtune", "operator"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        time.sleep(5)
        before = request_counts(env)
        cpu0, _ = proc_stats(op.pid)
        t0 = time.monotonic()
        kubectl(env, "apply", "-f", "-", input=yaml.safe_dump_all([isvc(i) for i in range(args.count)]))
        applied_s = time.monotonic() - t0
        timeline: list[tuple[float, int]] = []
        while True:
            n = ready_count(env)
            timeline.append((time.monotonic() - t0, n))
            print(f"{timeline[-1][0]:6.1f} s: {n}/{args.count} Ready", flush=True)
            if n >= args.count or time.monotonic() - t0 > args.timeout:
                break
            time.sleep(5)
        all_ready_s = time.monotonic() - t0
        at_ready = request_counts(env)
        cpu1, rss = proc_stats(op.pid)
        steady = []
        for _ in range(2):
            a = request_counts(env)
            time.sleep(args.steady_seconds)
            b = request_counts(env)
            steady.append(sum((b - a).values()) * 60 / args.steady_seconds)
        cpu2, rss = proc_stats(op.pid)
    finally:
        # Delete while the operator runs: kopf's daemons put a finalizer on each InferenceService.
        kubectl(env, "delete", "namespace", NAMESPACE, "--timeout=300s", check=False)
        op.terminate()
        op.wait(timeout=30)
        kubectl(env, "delete", "pv", "scale-engines", "--ignore-not-found", check=False)
    burst = at_ready - before
    per_resource = {f"{r}/{v}": c / args.count for (r, v), c in sorted(burst.items()) if c >= args.count / 10}
    summary = {
        "count": args.count,
        "ready": timeline[-1][1],
        "all_ready_seconds": round(all_ready_s, 1),
        "kubectl_apply_seconds": round(applied_s, 1),
        "load_average_1m_at_end": os.getloadavg()[0],
        "operator_cpu_seconds_to_ready": round(cpu1 - cpu0, 1),
        "operator_cpu_seconds_per_resource": round((cpu1 - cpu0) / args.count, 3),
        "operator_peak_rss_mib": round(rss / 2**20, 1),
        "api_requests_per_resource_all_clients": round(sum(burst.values()) / args.count, 1),
        "api_requests_per_resource_by_kind": {k: round(v, 2) for k, v in per_resource.items()},
        "steady_requests_per_minute_all_clients": [round(x, 1) for x in steady],
        "steady_operator_cpu_seconds": round(cpu2 - cpu1, 1),
    }
    (OUT / "results.json").write_text(json.dumps(summary, indent=2))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot([t for t, _ in timeline], [n for _, n in timeline], marker=".")
    ax.set_xlabel("seconds since kubectl apply")
    ax.set_ylabel("InferenceServices Ready")
    ax.set_title(f"{args.count} InferenceServices applied at once (kwok GPU nodes)")
    fig.tight_layout()
    fig.savefig(OUT / "ready.png", dpi=120)
    print(json.dumps(summary, indent=2))
    return 0 if summary["ready"] == args.count else 1


if __name__ == "__main__":
    raise SystemExit(main())

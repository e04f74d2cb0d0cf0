"""Reload faults the harness injects into the demo runtime's pods: the next config reload of one pod is refused
by Triton, or loads a config that serves slower than it should (a batching change worse than the tuner's
model of it). They stand in for what a canary rollout must survive; the operator never sees this module.

A fault is a file `<runtime workdir>/faults/<pod IP>.json`, written by a test (`inject_reload_fault`) and taken,
once, by the pod's emulation shim with the next model load that carries a config override (`take_reload_fault`):
only that reload is affected, so the rollback that follows it loads a healthy config again.

- `refuse`: the config reaches Triton with its instance group on `KIND_GPU`; this CPU-only Triton refuses
  it ("KIND_GPU but no GPUs are available") and keeps serving the config it had, as after any refused reload.
- `slow`: the config loads, and every execution of the emulated device takes `extra_ms` longer.
- `hold`: the load stays in flight for `hold_ms` before it reaches Triton (a slow reload: the pod keeps serving
  the config it had meanwhile), then loads unchanged; it fails at once (UNAVAILABLE) if the pod's
  `tritonserver` goes away during the hold, as a load does when its server dies. A test kills a pod mid-reload
  with it.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tritonclient.grpc import model_config_pb2

from tailtune.triton.config import ModelConfig

FaultKind = Literal["refuse", "slow", "hold"]
# The emulated model's parameter for the slow fault (devkit/triton/models/emulated_gpu/model.py reads it).
EXTRA_MS_PARAMETER = "extra_ms"


@dataclass(frozen=True)
class ReloadFault:
    """What happens to the next config reload of one pod."""

    kind: FaultKind
    extra_ms: float = 0.0
    hold_ms: float = 0.0  # `hold`: how long the load is held before it reaches Triton

    def apply(self, cfg: ModelConfig) -> ModelConfig:
        """The emulated config as this fault leaves it. Pure."""
        out = model_config_pb2.ModelConfig()
        out.CopyFrom(cfg)
        if self.kind == "refuse":
            for group in out.instance_group:
                group.kind = model_config_pb2.ModelInstanceGroup.Kind.Value("KIND_GPU")
        elif self.kind == "slow":
            out.parameters[EXTRA_MS_PARAMETER].string_value = f"{self.extra_ms:g}"
        return out

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "extra_ms": self.extra_ms, "hold_ms": self.hold_ms})

    @classmethod
    def from_json(cls, text: str) -> ReloadFault:
        doc = json.loads(text)
        kind = doc.get("kind")
        if kind not in ("refuse", "slow", "hold"):
            raise ValueError(f"unknown reload fault {kind!r}")
        extra = float(doc.get("extra_ms") or 0.0)
        hold = float(doc.get("hold_ms") or 0.0)
        if kind == "slow" and not extra > 0:
            raise ValueError("a slow reload fault needs extra_ms > 0")
        if kind == "hold" and not hold > 0:
            raise ValueError("a hold reload fault needs hold_ms > 0")
        return cls(kind, extra, hold)


def fault_path(faults_dir: Path, pod_ip: str) -> Path:
    return faults_dir / f"{pod_ip}.json"


def inject_reload_fault(faults_dir: Path, pod_ip: str, fault: ReloadFault) -> Path:
    """Arm `fault` for the next config reload of the pod at `pod_ip` (replacing one armed before)."""
    faults_dir.mkdir(parents=True, exist_ok=True)
    path = fault_path(faults_dir, pod_ip)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(fault.to_json())
    tmp.replace(path)  # whole or absent: the shim never reads half a file
    return path


def take_reload_fault(faults_dir: Path | None, pod_ip: str) -> ReloadFault | None:
    """The fault armed for this pod's reload, disarmed as it is taken (once, even with reloads in parallel)."""
    if faults_dir is None:
        return None
    path = fault_path(faults_dir, pod_ip)
    taken = path.with_suffix(f".taken-{os.getpid()}-{threading.get_ident()}")
    try:
        path.rename(taken)
    except FileNotFoundError:
        return None
    try:
        return ReloadFault.from_json(taken.read_text())
    finally:
        taken.unlink(missing_ok=True)

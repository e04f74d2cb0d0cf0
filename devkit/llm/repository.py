"""Lay out the EMULATED LLM in a Triton model repository: a decoupled Python-backend model (config.pbtxt and
`1/model.py` from `devkit/triton/models/emulated_llm`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import devkit
from devkit.llm.engine import ROOFLINES, SCHEDULER_POLICIES, SchedulerPolicy
from devkit.triton.local import venv_site_packages


@dataclass(frozen=True)
class EmulatedLlm:
    """The emulated engine's settings, by TensorRT-LLM's parameter names where it has them."""

    roofline: str = "l4"
    time_scale: float = 1.0
    max_batch_size: int = 256
    max_num_tokens: int = 8192
    batch_scheduler_policy: SchedulerPolicy = "guaranteed_no_evict"
    enable_chunked_context: bool = False
    kv_cache_free_gpu_mem_fraction: float = 0.9
    kv_cache_tokens: int | None = None
    iteration_overhead_ms: float = 0.0
    max_queue_size: int = 0
    # Requests the model runs through its engine before it turns READY (the pod's warmup, `devkit.llm.pod`).
    warmup_requests: int = 0

    def parameters(self) -> dict[str, str]:
        """The config's string parameters the model reads."""
        if self.roofline not in ROOFLINES:
            raise ValueError(f"roofline {self.roofline!r}: use one of {', '.join(ROOFLINES)}")
        if self.batch_scheduler_policy not in SCHEDULER_POLICIES:
            raise ValueError(f"batch_scheduler_policy: use one of {', '.join(SCHEDULER_POLICIES)}")
        out = {
            "roofline": self.roofline,
            "time_scale": repr(self.time_scale),
            "max_batch_size": str(self.max_batch_size),
            "max_num_tokens": str(self.max_num_tokens),
            "batch_scheduler_policy": self.batch_scheduler_policy,
            "enable_chunked_context": "true" if self.enable_chunked_context else "false",
            "kv_cache_free_gpu_mem_fraction": repr(self.kv_cache_free_gpu_mem_fraction),
            "iteration_overhead_ms": repr(self.iteration_overhead_ms),
            "max_queue_size": str(self.max_queue_size),
            "warmup_requests": str(self.warmup_requests),
        }
        if self.kv_cache_tokens is not None:
            out["kv_cache_tokens"] = str(self.kv_cache_tokens)
        return out


def source_root() -> str:
    """The folder holding the `devkit` package: the model imports the engine from there."""
    return str(Path(devkit.__file__).resolve().parent.parent)


def render_config(name: str, llm: EmulatedLlm) -> str:
    """config.pbtxt: decoupled, one CPU instance (one emulated GPU), TensorRT-LLM's tensor names; the paths of this
    venv and checkout as parameters, for the stub to import numpy and the engine."""
    params = {**llm.parameters(), "site_packages": venv_site_packages(), "source_root": source_root()}
    lines = [
        f'name: "{name}"',
        'backend: "python"',
        "max_batch_size: 0",
        "model_transaction_policy { decoupled: true }",
        'input [ { name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] },',
        '        { name: "request_output_len" data_type: TYPE_INT32 dims: [ 1 ] } ]',
        'output [ { name: "output_ids" data_type: TYPE_INT32 dims: [ -1 ] } ]',
        "instance_group [ { count: 1 kind: KIND_CPU } ]",
    ]
    lines += [f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in sorted(params.items())]
    return "\n".join(lines) + "\n"


def write_llm_repository(dest: str | os.PathLike[str], name: str, llm: EmulatedLlm) -> Path:
    """Write `<dest>/<name>/config.pbtxt` and `<dest>/<name>/1/model.py`; return the model's folder."""
    model_dir = Path(dest) / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    source = resources.files("devkit.triton").joinpath("models", "emulated_llm", "model.py")
    (model_dir / "1" / "model.py").write_text(source.read_text())
    (model_dir / "config.pbtxt").write_text(render_config(name, llm))
    return model_dir

"""Lay out the EMULATED LLM in a Triton model repository: a decoupled Python-backend model (config.pbtxt and
`1/model.py` from `devkit/triton/models/emulated_llm`).

The emulated model takes TensorRT-LLM's load-time settings (`batch_scheduler_policy`, `kv_cache_free_gpu_mem_fraction`,
`enable_chunked_context`, `max_queue_size`) from the operator's tensorrt_llm config (`with_trtllm_settings`), at pod
start from the ConfigMap and at a reload from the config override (`emulate_trtllm`, the pod's shim), and reports them
where that config has them (parameters; `dynamic_batching.default_queue_policy.max_queue_size`), so the operator reads
them back from the live config as it would from the real backend.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

import devkit
from devkit.llm.engine import ROOFLINES, SCHEDULER_POLICIES, SchedulerPolicy
from devkit.triton.local import venv_site_packages
from tailtune.triton.config import ModelConfig, config_to_json
from tailtune.triton.trtllm_config import BACKEND as TRTLLM_BACKEND
from tailtune.triton.trtllm_config import llm_serving_from_config


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

    @classmethod
    def from_parameters(cls, params: Mapping[str, str]) -> EmulatedLlm:
        """The inverse of `parameters` (other keys ignored; a key missing keeps its default)."""
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = params.get(f.name)
            if raw is None:
                continue
            kind = {"bool": bool, "int": int, "float": float}.get(str(f.type).split(" |")[0], str)
            values[f.name] = raw.lower() == "true" if kind is bool else kind(raw)
        return cls(**values)  # type: ignore[arg-type]


def is_trtllm_config(cfg: ModelConfig) -> bool:
    """The config is Triton's tensorrt_llm model (the operator's config of a generative model)."""
    return bool(cfg.backend == TRTLLM_BACKEND)


def with_trtllm_settings(llm: EmulatedLlm, cfg: ModelConfig) -> EmulatedLlm:
    """`llm` with the load-time settings a tensorrt_llm config carries (the backend's defaults where it has none)."""
    s = llm_serving_from_config(json.loads(config_to_json(cfg)))
    return replace(
        llm,
        batch_scheduler_policy=s.batch_scheduler_policy,
        kv_cache_free_gpu_mem_fraction=s.kv_cache_free_gpu_mem_fraction,
        enable_chunked_context=s.enable_chunked_context,
        max_queue_size=s.max_queue_size,
    )


def parse_pbtxt(text: str) -> ModelConfig:
    """A `config.pbtxt` as a ModelConfig (fields this Triton does not know are skipped)."""
    cfg = model_config_pb2.ModelConfig()
    text_format.Parse(text, cfg, allow_unknown_field=True)
    return cfg


def emulate_trtllm(cfg: ModelConfig, parameters: Mapping[str, str]) -> ModelConfig:
    """A tensorrt_llm config (the operator's reload override) as the emulated LLM's config: the pod's emulation
    (`parameters`, as the pod started with them) with the load-time settings `cfg` carries."""
    llm = with_trtllm_settings(EmulatedLlm.from_parameters(parameters), cfg)
    return parse_pbtxt(render_config(cfg.name, llm))


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
    if llm.max_queue_size:  # where Triton's tensorrt_llm config keeps it (read back by the operator; Triton bounds it)
        lines.append(f"dynamic_batching {{ default_queue_policy {{ max_queue_size: {llm.max_queue_size} }} }}")
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

"""EMULATED `trtllm-build` for the local runtime (no GPU, no TensorRT-LLM here): what the engine build Job of a
generative InferenceService does on a real cluster, reduced to what the operator and the serving pod see.

    python -m devkit.llm.build <the build Job's arguments>

`devkit.runtime` runs this in place of `python -m tailtune.engine_builder` for a build pod with
`emulated-llm.dev.tailtune.io/*` annotations (`spec.engine.podAnnotations`). From the Job's arguments it reads only
`--store`, `--cache-key`, `--model-name` and `--gpu-product` (the rest are trtllm-build's limits, which the emulated
engine takes from the pod annotations instead) and
- publishes a store entry `<store>/<key>/<model>/1/engine/` holding a stand-in `config.json` that says it is an
  emulation (the serving pod links it as TensorRT-LLM's engine folder; the emulated model does not read it);
- leaves the build report a successful build leaves (`--termination-log`): the engine's tensors as TensorRT-LLM's
  Triton model takes them (`input_ids`, `request_output_len` -> `output_ids`, INT32) and the GPU product.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tailtune.engine_builder.store import METADATA_FILE, MODEL_VERSION

ENGINE_FOLDER = "engine"
# TensorRT-LLM's Triton model's tensors (tensorrtllm_backend all_models/inflight_batcher_llm/tensorrt_llm).
TENSORS = {
    "inputs": [
        {"name": "input_ids", "dataType": "TYPE_INT32", "dims": [-1]},
        {"name": "request_output_len", "dataType": "TYPE_INT32", "dims": [1]},
    ],
    "outputs": [{"name": "output_ids", "dataType": "TYPE_INT32", "dims": [-1]}],
}


def build(store: Path, key: str, model: str, gpu_product: str) -> dict[str, object]:
    """Publish the stand-in entry (kept when already there, as a store hit) and return the build report."""
    entry = store / key
    engine = entry / model / MODEL_VERSION / ENGINE_FOLDER
    if not (entry / METADATA_FILE).exists():
        engine.mkdir(parents=True, exist_ok=True)
        stand_in = {"emulated": True, "note": "EMULATED engine (devkit.llm.build): no weights; devkit.llm serves"}
        (engine / "config.json").write_text(json.dumps(stand_in) + "\n")
        meta = {"backend": "tensorrt-llm", "emulated": True, "gpuProduct": gpu_product, "modelName": model}
        (entry / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return {"location": str(entry), "gpuProduct": gpu_product, "engineBytes": 0, **TENSORS}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devkit.llm.build", description=__doc__)
    p.add_argument("--store", type=Path, required=True)
    p.add_argument("--cache-key", required=True)
    p.add_argument("--model-name", required=True)
    p.add_argument("--gpu-product", default="")
    p.add_argument("--termination-log", type=Path)
    args, _ = p.parse_known_args(argv)
    report = build(args.store, args.cache_key, args.model_name, args.gpu_product)
    text = json.dumps(report)
    print(text)
    if args.termination_log is not None:
        args.termination_log.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The engine store: `<store>/<key>/` is a Triton model repository plus `metadata.json`.

```
<store>/<key>/metadata.json
<store>/<key>/<model_name>/1/model.plan     (tensorrt)
<store>/<key>/<model_name>/1/model.onnx     (onnxruntime)
<store>/<key>/<model_name>/1/engine/        (tensorrt-llm: rank0.engine, config.json)
<store>/timing-caches/tensorrt-<version>-<gpu product>.cache
```
An entry is published by renaming a finished folder into place, so `metadata.json` exists
only beside a complete artifact: its presence is what a store hit means.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tailtune.engine_builder.errors import BuildError, Failure

METADATA_FILE = "metadata.json"
MODEL_VERSION = "1"
# The artifact of each backend; a TensorRT-LLM engine is the folder trtllm-build writes (rank0.engine, config.json).
ARTIFACTS = {"tensorrt": "model.plan", "onnxruntime": "model.onnx", "tensorrt-llm": "engine"}


def artifact_path(entry: Path, model_name: str, backend: str) -> Path:
    """Where Triton expects the model file inside a repository entry."""
    return entry / model_name / MODEL_VERSION / ARTIFACTS[backend]


def timing_cache_path(store: Path, tensorrt_version: str, gpu_product: str) -> Path:
    """Timing caches hold per-device timings of one TensorRT version; models share them."""
    product = "".join(c if c.isalnum() or c in "._-" else "_" for c in gpu_product)
    return store / "timing-caches" / f"tensorrt-{tensorrt_version}-{product}.cache"


def read_metadata(store: Path, key: str) -> dict[str, Any] | None:
    """The entry's metadata, or None when the key is not in the store."""
    path = store / key / METADATA_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BuildError(Failure.STORE_FAILED, f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None  # unreadable metadata is no hit: the entry is rebuilt and replaced
    return data if isinstance(data, dict) else None


def publish(
    store: Path,
    key: str,
    *,
    model_name: str,
    backend: str,
    write_artifact: Callable[[Path], object],
    metadata: Mapping[str, Any],
) -> Path:
    """Write the artifact and metadata into a scratch folder in the store, then rename it to `<key>`.

    If another builder published the key meanwhile, its entry stays and ours is dropped.
    """
    final = store / key
    try:
        store.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=store))
    except OSError as exc:
        raise BuildError(Failure.STORE_FAILED, f"cannot write the store {store}: {exc.strerror or exc}") from None
    try:
        artifact = artifact_path(staging, model_name, backend)
        artifact.parent.mkdir(parents=True)
        write_artifact(artifact)
        (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        staging.chmod(0o755)  # mkdtemp makes it 0700; Triton may run as another user
        if final.exists() and read_metadata(store, key) is None:
            shutil.rmtree(final)  # a leftover without metadata is not an entry
        try:
            os.rename(staging, final)
        except OSError:
            if read_metadata(store, key) is None:
                raise
    except OSError as exc:
        raise BuildError(Failure.STORE_FAILED, f"cannot write {final}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final

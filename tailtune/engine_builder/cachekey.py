"""The engine cache key: a pure hash of everything that makes a built engine valid.

One recipe, `engine_key`: `KeyInputs` (what shapes the engine) → `compute_cache_key`'s arguments → key.
The operator and the builder both go through it; they differ only in what they can know.

The key in force is the operator's: it computes it before any build from the spec (the declared sha256,
else the URI; the builder image standing for the TensorRT version; no compute capability; the calibration
cache's URI), names the build Job after it, and passes it to the builder as `--cache-key`, which stores
the entry under it as given. The builder computes a key itself (from the digest it measured, the installed
TensorRT, the visible GPU) only when run without `--cache-key`, by hand or by `engine_builder key`.
Stdlib only, no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

CACHE_KEY_PREFIX = "eng-"
# 16 hex chars = 64 bits: collisions are out of reach for one store, and the key stays
# short enough to be a Job name (DNS-1123 label, 63 chars) with room for suffixes.
CACHE_KEY_HEX_CHARS = 16
# Bump when the meaning of an input changes, so old entries stop matching.
CACHE_KEY_SCHEMA = 1

FlagValue = str | int | bool
_SHA256 = re.compile(r"(?:sha256:)?([0-9a-fA-F]{64})")


def compute_cache_key(
    *,
    model_digest: str,
    tensorrt_version: str,
    gpu_product: str,
    compute_capability: str,
    precision: str,
    profile: tuple[int, int, int],
    flags: Mapping[str, FlagValue],
) -> str:
    """Return `eng-` + 16 hex chars of sha256 over a canonical JSON of the inputs.

    `profile` is (min, opt, max) of the batch dim. `flags` holds every other builder
    setting that changes the engine; its ordering does not matter, its types do
    (`1` and `True` and `"1"` give different keys).
    """
    if len(profile) != 3 or not all(_is_int(p) for p in profile):
        raise ValueError(f"profile must be three ints (min, opt, max), got {profile!r}")
    for name, value in flags.items():
        if not isinstance(name, str) or not isinstance(value, str | int | bool):
            raise ValueError(f"flag {name!r} must map a str to a str, int or bool, got {value!r}")
    canonical = json.dumps(
        {
            "schema": CACHE_KEY_SCHEMA,
            "model_digest": _normalize_digest(model_digest),
            "tensorrt_version": tensorrt_version,
            "gpu_product": gpu_product,
            "compute_capability": compute_capability,
            "precision": precision,
            "profile": list(profile),
            "flags": dict(flags),
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
    )
    digest = hashlib.sha256(canonical.encode("ascii")).hexdigest()
    return CACHE_KEY_PREFIX + digest[:CACHE_KEY_HEX_CHARS]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _normalize_digest(digest: str) -> str:
    """`sha256:ABC…` and `abc…` name the same bytes; any other digest form is kept as given."""
    match = _SHA256.fullmatch(digest.strip())
    return match.group(1).lower() if match else digest


@dataclass(frozen=True)
class KeyInputs:
    """What makes a built engine valid, as whoever computes the key knows it.

    `calibration` names the int8 calibration cache (its sha256 where it was read, else its URI; "" for none);
    `dim_ranges` maps (input, axis) to the (min, opt, max) of another dynamic dim; `model_revision` is the spec's
    label of the model's version ("" for none: no flag, so keys made before it existed stay as they were), which
    only the operator knows: a new one names a new entry, built from the bytes the URI serves then.
    """

    backend: str
    model_digest: str
    model_name: str  # the entry's layout holds it: <key>/<model_name>/1/
    precision: str
    profile: tuple[int, int, int]
    gpu_product: str
    tensorrt_version: str
    compute_capability: str = ""
    workspace_mib: int = 4096
    opt_level: int = 3
    calibration: str = ""
    model_revision: str = ""
    dim_ranges: Mapping[tuple[str, int], tuple[int, int, int]] = field(default_factory=dict)
    # A TensorRT-LLM engine (backend tensorrt-llm): TensorRT-LLM's version and every trtllm-build option
    # (`trtllm.TrtllmBuildSpec.options`); empty for the other backends, whose keys stay as they were.
    tensorrt_llm_version: str = ""
    llm: Mapping[str, FlagValue] = field(default_factory=dict)


def key_arguments(inputs: KeyInputs) -> dict[str, Any]:
    """The arguments of `compute_cache_key` for `inputs`. Pure.

    An onnxruntime entry is the ONNX file itself: it depends on neither a GPU nor TensorRT nor the TensorRT
    builder's settings. A TensorRT-LLM engine depends on the GPU, TensorRT, TensorRT-LLM and trtllm-build's
    options (`llm`), not on the TensorRT builder's workspace or level. The timing cache only speeds a build up,
    so it is no input at all.
    """
    on_gpu = inputs.backend in ("tensorrt", "tensorrt-llm")
    flags: dict[str, FlagValue] = {"backend": inputs.backend, "model_name": inputs.model_name}
    if inputs.model_revision:
        flags["model_revision"] = inputs.model_revision
    if inputs.tensorrt_llm_version:
        flags["tensorrt_llm_version"] = inputs.tensorrt_llm_version
    for name, value in sorted(inputs.llm.items()):
        flags[f"llm:{name}"] = value
    if inputs.backend == "tensorrt":
        flags |= {"workspace_mib": inputs.workspace_mib, "opt_level": inputs.opt_level}
        if inputs.calibration:
            flags["calibration_cache"] = inputs.calibration
        for (name, axis), (lo, opt, hi) in sorted(inputs.dim_ranges.items()):
            flags[f"dim:{name}:{axis}"] = f"{lo},{opt},{hi}"
    return {
        "model_digest": inputs.model_digest,
        "tensorrt_version": inputs.tensorrt_version if on_gpu else "",
        "gpu_product": inputs.gpu_product if on_gpu else "",
        "compute_capability": inputs.compute_capability if on_gpu else "",
        "precision": inputs.precision,
        "profile": inputs.profile,
        "flags": flags,
    }


def engine_key(inputs: KeyInputs) -> str:
    """The cache key of `inputs`: the one recipe of the operator and the builder."""
    return compute_cache_key(**key_arguments(inputs))

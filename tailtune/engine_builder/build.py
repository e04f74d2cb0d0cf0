"""One engine build: fetch → verify → key → store hit? → inspect → build → publish.

`run_build` takes what it observes about its machine (`Machine`) and its clock as arguments,
so the flow runs the same in tests and in the Job.
"""

from __future__ import annotations

import functools
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tailtune.engine_builder import cachekey, fetch, gpu, onnx_model, ort, store, timing, trt
from tailtune.engine_builder.errors import BuildError, Failure

BACKENDS = ("tensorrt", "onnxruntime")
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
METADATA_SCHEMA = 1


@dataclass(frozen=True)
class BuildRequest:
    """What the operator asks for (the Job's flags)."""

    model_uri: str
    backend: str
    model_name: str
    store: Path
    precision: str = "fp32"
    max_batch: int = 1
    opt_batch: int = 1
    workspace_mib: int = 4096
    opt_level: int = 3
    timing_cache: bool = False
    sha256: str | None = None
    calibration_cache: str | None = None
    gpu_product: str = ""
    dim_ranges: Mapping[tuple[str, int], tuple[int, int, int]] = field(default_factory=dict)
    # The key the operator computed (and named the Job after); None: compute it here.
    cache_key: str | None = None
    # Time the engine at `timing.ladder(max_batch)` after building (the metadata's `serviceTime`).
    measure_service_time: bool = True

    @property
    def profile(self) -> tuple[int, int, int]:
        return (1, self.opt_batch, self.max_batch)


@dataclass(frozen=True)
class Machine:
    """What the build observed about where it runs. Empty strings for the onnxruntime backend."""

    tensorrt_version: str
    gpu: gpu.GpuInfo | None
    pvc_root: Path
    builder_version: str
    fetch_timeout_s: float = 60.0


@dataclass(frozen=True)
class BuildOutcome:
    cache_key: str
    store_hit: bool
    entry: Path
    metadata: Mapping[str, Any]


def validate_request(req: BuildRequest) -> None:
    """Refuse inconsistent flags before any work. Pure."""
    if req.backend not in BACKENDS:
        raise BuildError(Failure.INVALID_ARGUMENTS, f"unknown backend {req.backend!r}; one of {', '.join(BACKENDS)}")
    if not 1 <= req.opt_batch <= req.max_batch:
        raise BuildError(
            Failure.INVALID_ARGUMENTS, f"need 1 <= opt batch ({req.opt_batch}) <= max batch ({req.max_batch})"
        )
    if req.workspace_mib < 1 or not 0 <= req.opt_level <= 5:
        raise BuildError(Failure.INVALID_ARGUMENTS, "need workspace >= 1 MiB and optimization level 0-5")
    if not _MODEL_NAME.fullmatch(req.model_name):
        raise BuildError(
            Failure.INVALID_ARGUMENTS,
            f"model name {req.model_name!r}: use letters, digits, '.', '_', '-' (a letter or digit first)",
        )
    if req.backend == "tensorrt" and not req.gpu_product:
        raise BuildError(Failure.INVALID_ARGUMENTS, "the tensorrt backend needs --gpu-product")
    gpu.check_precision(req.precision, backend=req.backend, calibration_cache=req.calibration_cache)


def key_inputs(req: BuildRequest, *, model_digest: str, machine: Machine, calibration_digest: str) -> dict[str, Any]:
    """The arguments of `compute_cache_key` for this request on this machine (`cachekey.key_arguments`). Pure."""
    return cachekey.key_arguments(
        cachekey.KeyInputs(
            backend=req.backend,
            model_digest=model_digest,
            model_name=req.model_name,
            precision=req.precision,
            profile=req.profile,
            gpu_product=req.gpu_product,
            tensorrt_version=machine.tensorrt_version,
            compute_capability=machine.gpu.compute_capability if machine.gpu else "",
            workspace_mib=req.workspace_mib,
            opt_level=req.opt_level,
            calibration=calibration_digest,
            dim_ranges=req.dim_ranges,
        )
    )


def run_build(req: BuildRequest, machine: Machine, scratch: Path, clock: Callable[[], float]) -> BuildOutcome:
    """Build (or find) the entry for `req`. Raises BuildError on every failure."""
    validate_request(req)
    if req.backend == "tensorrt":
        if machine.gpu is None:
            raise BuildError(Failure.GPU_MISMATCH, "no GPU visible to the build Job")
        gpu.check_gpu_product(machine.gpu, req.gpu_product)
        gpu.check_precision_on_gpu(req.precision, machine.gpu.compute_capability)
    _require_tensorrt(req, machine)
    calibration = _fetch_calibration(req, machine, scratch)
    calibration_digest = calibration.sha256 if calibration else ""

    key = req.cache_key
    if key is None and req.sha256 is not None:
        key = _key(req, fetch.normalize_sha256(req.sha256), machine, calibration_digest)
    if key is not None and (hit := store.read_metadata(req.store, key)) is not None:
        return BuildOutcome(cache_key=key, store_hit=True, entry=req.store / key, metadata=_sized(req.store / key, hit))

    started = clock()
    model = fetch.fetch(req.model_uri, scratch, pvc_root=machine.pvc_root, timeout_s=machine.fetch_timeout_s)
    if req.sha256 is not None:
        fetch.verify_sha256(model, req.sha256)
    if key is None:
        key = _key(req, model.sha256, machine, calibration_digest)
        if (hit := store.read_metadata(req.store, key)) is not None:
            return BuildOutcome(
                cache_key=key, store_hit=True, entry=req.store / key, metadata=_sized(req.store / key, hit)
            )

    info = onnx_model.load_model_info(model.path)
    onnx_model.check_servable(info, backend=req.backend, max_batch=req.max_batch, dim_ranges=req.dim_ranges)
    write_artifact, runtime = _make_artifact(req, machine, model.path, calibration, info)
    metadata = build_metadata(
        req, key=key, machine=machine, info=info, model_digest=model.sha256, build_seconds=clock() - started
    )
    metadata |= runtime
    entry = store.publish(
        req.store,
        key,
        model_name=req.model_name,
        backend=req.backend,
        write_artifact=write_artifact,
        metadata=metadata,
    )
    return BuildOutcome(cache_key=key, store_hit=False, entry=entry, metadata=metadata)


def _make_artifact(
    req: BuildRequest,
    machine: Machine,
    model_path: Path,
    calibration: fetch.Fetched | None,
    info: onnx_model.ModelInfo,
) -> tuple[Callable[[Path], object], dict[str, Any]]:
    """Build the engine (tensorrt) or check the model loads (onnxruntime), and time it at the batch ladder.

    Returns the artifact's writer and the runtime facts for the metadata (`engineBytes`: the artifact's size,
    which a hot reload needs free on the GPU a second time; `serviceTime` when measured).
    """
    sizes = timing.ladder(req.max_batch) if req.measure_service_time else ()
    if req.backend == "onnxruntime":
        checked = ort.check_loads(model_path)
        measured = ort.time_ladder(model_path, info.inputs, sizes, req.dim_ranges) if checked and sizes else ()
        return functools.partial(shutil.copyfile, model_path), {
            "onnxruntimeVersion": ort.onnxruntime_version() if checked else None,
            "engineBytes": model_path.stat().st_size,
        } | _service_time(measured)
    engine = trt.build_engine(
        model_path,
        trt.TrtBuildSpec(
            precision=req.precision,
            profile=req.profile,
            dim_ranges=req.dim_ranges,
            workspace_mib=req.workspace_mib,
            opt_level=req.opt_level,
            timing_cache=_timing_cache(req, machine),
            calibration_cache=calibration.path.read_bytes() if calibration else None,
        ),
    )
    measured = trt.time_engine(engine, sizes, req.dim_ranges) if sizes else ()
    return functools.partial(Path.write_bytes, data=engine), {"engineBytes": len(engine)} | _service_time(measured)


def _sized(entry: Path, metadata: Mapping[str, Any]) -> Mapping[str, Any]:
    """A store entry's metadata with `engineBytes`, measured from its artifact when an older builder left it out."""
    if metadata.get("engineBytes") is not None or not isinstance(metadata.get("artifact"), str):
        return metadata
    try:
        return {**metadata, "engineBytes": (entry / metadata["artifact"]).stat().st_size}
    except OSError:
        return metadata


def _service_time(measured: timing.ServiceTime) -> dict[str, Any]:
    return {"serviceTime": timing.report_points(measured)} if measured else {}


def request_key(req: BuildRequest, machine: Machine, scratch: Path) -> str:
    """The cache key `run_build` would use, fetching the model only when no --sha256 names it."""
    validate_request(req)
    _require_tensorrt(req, machine)
    if req.cache_key is not None:
        return req.cache_key
    calibration = _fetch_calibration(req, machine, scratch)
    if req.sha256 is not None:
        digest = fetch.normalize_sha256(req.sha256)
    else:
        digest = fetch.fetch(
            req.model_uri, scratch, pvc_root=machine.pvc_root, timeout_s=machine.fetch_timeout_s
        ).sha256
    return _key(req, digest, machine, calibration.sha256 if calibration else "")


def build_metadata(
    req: BuildRequest,
    *,
    key: str,
    machine: Machine,
    info: onnx_model.ModelInfo,
    model_digest: str,
    build_seconds: float,
) -> dict[str, Any]:
    """The entry's `metadata.json`. Pure."""
    return {
        "schema": METADATA_SCHEMA,
        "cacheKey": key,
        "backend": req.backend,
        "modelName": req.model_name,
        "modelVersion": store.MODEL_VERSION,
        "artifact": f"{req.model_name}/{store.MODEL_VERSION}/{store.ARTIFACTS[req.backend]}",
        "modelUri": fetch.redact(req.model_uri),
        "modelDigest": f"sha256:{model_digest}",
        "tensorrtVersion": machine.tensorrt_version or None,
        "gpu": (
            {
                "product": req.gpu_product,
                "name": machine.gpu.name,
                "computeCapability": machine.gpu.compute_capability,
            }
            if req.backend == "tensorrt" and machine.gpu
            else None
        ),
        "precision": req.precision,
        "maxBatchSize": req.max_batch,
        "profile": {"min": req.profile[0], "opt": req.profile[1], "max": req.profile[2]},
        "dimRanges": [
            {"input": name, "axis": axis, "min": lo, "opt": opt, "max": hi}
            for (name, axis), (lo, opt, hi) in sorted(req.dim_ranges.items())
        ],
        "flags": {
            "workspaceMiB": req.workspace_mib,
            "optLevel": req.opt_level,
            "timingCache": req.timing_cache,
        },
        "opset": info.opset,
        "inputs": [t.to_json() for t in info.inputs],
        "outputs": [t.to_json() for t in info.outputs],
        "buildSeconds": round(build_seconds, 3),
        "builderVersion": machine.builder_version,
    }


def _key(req: BuildRequest, model_digest: str, machine: Machine, calibration_digest: str) -> str:
    return cachekey.compute_cache_key(
        **key_inputs(req, model_digest=model_digest, machine=machine, calibration_digest=calibration_digest)
    )


def _require_tensorrt(req: BuildRequest, machine: Machine) -> None:
    if req.backend == "tensorrt" and not machine.tensorrt_version:
        raise BuildError(Failure.BUILD_FAILED, "TensorRT is not installed in this image (import tensorrt failed)")


def _fetch_calibration(req: BuildRequest, machine: Machine, scratch: Path) -> fetch.Fetched | None:
    if req.backend != "tensorrt" or req.precision != "int8" or not req.calibration_cache:
        return None
    return fetch.fetch(
        req.calibration_cache,
        scratch,
        pvc_root=machine.pvc_root,
        timeout_s=machine.fetch_timeout_s,
        name="calibration.cache",
    )


def _timing_cache(req: BuildRequest, machine: Machine) -> Path | None:
    if not req.timing_cache or machine.gpu is None:
        return None
    return store.timing_cache_path(req.store, machine.tensorrt_version, req.gpu_product)

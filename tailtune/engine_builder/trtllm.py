"""The TensorRT-LLM engine of a generative model: `trtllm-build` on the serving GPU, cached by the same key recipe.

`python -m tailtune.engine_builder build-llm ...` runs it in the build Job: fetch the TensorRT-LLM checkpoint
(a directory, or a tar archive of one, as `convert_checkpoint.py` writes it: `config.json` and
`rank<N>.safetensors`) → check it against the spec (dtype, tensor parallelism) → key → store hit? → run the
`trtllm-build` CLI with the spec's limits → publish `<store>/<key>/<model>/1/engine/` (rank0.engine, config.json),
which the `tensorrt_llm` model config's `gpt_model_path` names.

The CLI, not TensorRT-LLM's Python API: it is what users run, its flags are documented
(nvidia.github.io/TensorRT-LLM/commands/trtllm-build.html), and this module then needs no TensorRT-LLM stubs.
It cannot run on this machine (no GPU, no TensorRT-LLM): it is type-checked, and its tests run the real flow
with a FAKE `trtllm-build` script (tests/unit/engine_builder/test_trtllm.py).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tailtune.api.v1alpha1 import LlmEngine
from tailtune.engine_builder import cachekey, fetch, gpu, store
from tailtune.engine_builder.errors import BuildError, Failure

# build (and trt) import onnx and numpy, which the operator (it reads this module's spec and key) need not have.
if TYPE_CHECKING:
    from tailtune.engine_builder.build import BuildOutcome

TRTLLM_BUILD = "trtllm-build"
BACKEND = "tensorrt-llm"  # the store entry's and the cache key's backend name
ENGINE_DIR = "engine"  # <key>/<model>/1/engine/: the folder trtllm-build writes, named by gpt_model_path
CHECKPOINT_CONFIG = "config.json"
# Build options every engine gets, whatever the spec: Triton's inflight fused batching needs a paged KV cache
# (tensorrtllm_backend docs), and `enable_chunked_context` at load needs paged context FMHA in the engine; the
# spec's serving.llm.enableChunkedContext is a reload lever, so every engine is built able to take it.
FIXED_BUILD_OPTIONS: Mapping[str, cachekey.FlagValue] = {
    "kv_cache_type": "paged",
    "use_paged_context_fmha": "enable",
    "max_beam_width": 1,
}
# Lines of trtllm-build's output kept for the termination message and the error's details.
OUTPUT_TAIL_LINES = 40
_OOM = re.compile(r"out of memory|CUDA_ERROR_OUT_OF_MEMORY|OutOfMemory", re.IGNORECASE)
# TensorRT-LLM's checkpoint dtypes (convert_checkpoint.py --dtype) as the spec names them.
CHECKPOINT_DTYPES = ("float16", "bfloat16", "float32")


@dataclass(frozen=True)
class TrtllmBuildSpec:
    """trtllm-build's limits from spec.engine.llm; fixed at build (Triton's tensorrtllm backend keeps them)."""

    max_batch_size: int = 2048
    max_num_tokens: int = 8192
    max_input_len: int = 1024
    max_seq_len: int | None = None  # None: trtllm-build takes the checkpoint's max_position_embeddings
    dtype: str | None = None  # None: whatever the checkpoint has
    tensor_parallel: int = 1

    @classmethod
    def from_api(cls, llm: LlmEngine) -> TrtllmBuildSpec:
        """The build spec of spec.engine.llm (or its defaults)."""
        return cls(
            max_batch_size=llm.max_batch_size,
            max_num_tokens=llm.max_num_tokens,
            max_input_len=llm.max_input_len,
            max_seq_len=llm.max_seq_len,
            dtype=llm.dtype,
            tensor_parallel=llm.tensor_parallel,
        )

    def options(self) -> dict[str, cachekey.FlagValue]:
        """Every build option that shapes the engine, the fixed ones included: the cache key's `llm` flags."""
        return {
            "max_batch_size": self.max_batch_size,
            "max_num_tokens": self.max_num_tokens,
            "max_input_len": self.max_input_len,
            "max_seq_len": self.max_seq_len if self.max_seq_len is not None else "checkpoint",
            "dtype": self.dtype or "checkpoint",
            "tensor_parallel": self.tensor_parallel,
            **FIXED_BUILD_OPTIONS,
        }


def validate_spec(spec: TrtllmBuildSpec) -> None:
    """Refuse limits trtllm-build would refuse or that cannot serve, naming the flag and the fix. Pure."""
    for name in ("max_batch_size", "max_num_tokens", "max_input_len"):
        if getattr(spec, name) < 1:
            raise BuildError(Failure.INVALID_ARGUMENTS, f"--{name.replace('_', '-')} must be >= 1")
    if spec.max_seq_len is not None and spec.max_seq_len <= spec.max_input_len:
        raise BuildError(
            Failure.INVALID_ARGUMENTS,
            f"--max-seq-len {spec.max_seq_len} must be > --max-input-len {spec.max_input_len} (the prompt plus at "
            "least one output token)",
        )
    if spec.dtype is not None and spec.dtype not in CHECKPOINT_DTYPES:
        raise BuildError(Failure.INVALID_ARGUMENTS, f"--dtype {spec.dtype!r}: one of {', '.join(CHECKPOINT_DTYPES)}")
    if spec.tensor_parallel != 1:
        raise BuildError(
            Failure.INVALID_ARGUMENTS,
            "--tensor-parallel must be 1: the serving pod runs one tritonserver, not the MPI ranks a "
            "tensor-parallel engine needs",
        )


def trtllm_build_argv(
    checkpoint_dir: Path,
    output_dir: Path,
    spec: TrtllmBuildSpec,
    *,
    executable: str = TRTLLM_BUILD,
    timing_cache: Path | None = None,
) -> list[str]:
    """trtllm-build's command line for `spec`, by its documented flags. Pure."""
    argv = [
        executable,
        "--checkpoint_dir", str(checkpoint_dir),
        "--output_dir", str(output_dir),
        "--max_batch_size", str(spec.max_batch_size),
        "--max_num_tokens", str(spec.max_num_tokens),
        "--max_input_len", str(spec.max_input_len),
    ]  # fmt: skip
    if spec.max_seq_len is not None:
        argv += ["--max_seq_len", str(spec.max_seq_len)]
    for flag, value in FIXED_BUILD_OPTIONS.items():
        argv += [f"--{flag}", str(value)]
    if timing_cache is not None:
        argv += ["--input_timing_cache", str(timing_cache), "--output_timing_cache", str(timing_cache)]
    return argv


@dataclass(frozen=True)
class LlmBuildRequest:
    """What the operator asks for (the Job's flags)."""

    checkpoint_uri: str
    model_name: str
    store: Path
    gpu_product: str
    spec: TrtllmBuildSpec = TrtllmBuildSpec()
    sha256: str | None = None
    cache_key: str | None = None  # the operator's key (the Job's name); None: compute it here
    timing_cache: bool = False


@dataclass(frozen=True)
class LlmMachine:
    """What the build observed about where it runs."""

    tensorrt_llm_version: str
    tensorrt_version: str
    gpu: gpu.GpuInfo | None
    pvc_root: Path
    builder_version: str
    fetch_timeout_s: float = 60.0


@dataclass(frozen=True)
class Checkpoint:
    """A TensorRT-LLM checkpoint on local disk, its digest, and its config.json."""

    path: Path
    sha256: str
    config: Mapping[str, Any]


# Runs a command, forwarding its output; returns (exit status, the output's last lines).
Runner = Callable[[Sequence[str]], tuple[int, list[str]]]


def run_streaming(argv: Sequence[str]) -> tuple[int, list[str]]:
    """Run `argv`, copying its output to stderr (the Job's log) line by line; keep the last lines."""
    tail: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL_LINES)
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace") as p:
        assert p.stdout is not None
        for line in p.stdout:
            sys.stderr.write(line)
            tail.append(line.rstrip("\n"))
    return p.returncode, list(tail)


def tree_sha256(root: Path) -> str:
    """The digest of a checkpoint folder: sha256 over `<relative path>\\0<sha256 of the file>\\n`, sorted by path.

    A declared spec.model.sha256 of a folder checkpoint is this value (`python -m tailtune.engine_builder
    key` prints the key; `tree_sha256` the digest); an archive's digest is its bytes'.
    """
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        h.update(f"{rel}\0{_file_sha256(path)}\n".encode())
    return h.hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def local_checkpoint_dir(uri: str, pvc_root: Path) -> Path | None:
    """The folder a pvc://, file:// or path URI names, when it is a folder; None for archives and remote URIs."""
    if uri.startswith("pvc://"):
        path = fetch.resolve_pvc_path(uri, pvc_root)
    elif uri.startswith("file://"):
        path = Path(uri.removeprefix("file://"))
    elif "://" in uri:
        return None
    else:
        path = Path(uri)
    return path if path.is_dir() else None


def fetch_checkpoint(req: LlmBuildRequest, machine: LlmMachine, scratch: Path) -> Checkpoint:
    """The checkpoint on local disk: a local folder in place, else the archive fetched and unpacked into scratch."""
    folder = local_checkpoint_dir(req.checkpoint_uri, machine.pvc_root)
    if folder is not None:
        digest = tree_sha256(folder)
        root = folder
    else:
        archive = fetch.fetch(
            req.checkpoint_uri,
            scratch,
            pvc_root=machine.pvc_root,
            timeout_s=machine.fetch_timeout_s,
            name="checkpoint.tar",
        )
        digest = archive.sha256
        if req.sha256 is not None:
            fetch.verify_sha256(archive, req.sha256)
        root = _unpack(req.checkpoint_uri, archive.path, scratch / "checkpoint")
    if req.sha256 is not None and folder is not None and fetch.normalize_sha256(req.sha256) != digest:
        raise BuildError(
            Failure.DIGEST_MISMATCH,
            f"{fetch.redact(req.checkpoint_uri)}: the checkpoint folder's digest is sha256:{digest}, not the "
            f"declared {req.sha256} (the digest of a folder is tree_sha256's: every file's sha256 by path)",
        )
    return Checkpoint(path=root, sha256=digest, config=read_checkpoint_config(req.checkpoint_uri, root))


def _unpack(uri: str, archive: Path, dest: Path) -> Path:
    """Unpack a checkpoint archive (tar, tar.gz, ...) safely; return the folder holding config.json."""
    if not tarfile.is_tarfile(archive):
        raise BuildError(
            Failure.CORRUPT_MODEL,
            f"{fetch.redact(uri)}: not a TensorRT-LLM checkpoint: neither a folder nor a tar archive of one "
            "(config.json and rank<N>.safetensors, as convert_checkpoint.py writes them)",
        )
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")  # refuses absolute paths, links out of dest, devices
    except (tarfile.TarError, OSError) as exc:
        raise BuildError(Failure.CORRUPT_MODEL, f"{fetch.redact(uri)}: cannot unpack the checkpoint: {exc}") from None
    if (dest / CHECKPOINT_CONFIG).is_file():
        return dest
    tops = [p for p in dest.iterdir() if p.is_dir()]
    if len(tops) == 1 and (tops[0] / CHECKPOINT_CONFIG).is_file():
        return tops[0]
    return dest  # read_checkpoint_config says what is missing


def read_checkpoint_config(uri: str, root: Path) -> Mapping[str, Any]:
    """The checkpoint's config.json, or CorruptModel naming what is missing."""
    path = root / CHECKPOINT_CONFIG
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BuildError(
            Failure.CORRUPT_MODEL,
            f"{fetch.redact(uri)}: not a TensorRT-LLM checkpoint: no {CHECKPOINT_CONFIG} (convert the model with "
            "TensorRT-LLM's convert_checkpoint.py and point spec.model.uri at its output)",
        ) from None
    except (OSError, ValueError) as exc:
        raise BuildError(Failure.CORRUPT_MODEL, f"{fetch.redact(uri)}: unreadable {CHECKPOINT_CONFIG}: {exc}") from None
    if not isinstance(data, dict):
        raise BuildError(Failure.CORRUPT_MODEL, f"{fetch.redact(uri)}: {CHECKPOINT_CONFIG} is not a JSON object")
    return data


def check_checkpoint(config: Mapping[str, Any], spec: TrtllmBuildSpec) -> None:
    """The checkpoint is what the spec says: its dtype (when the spec names one) and one rank. Pure."""
    dtype = config.get("dtype")
    if spec.dtype is not None and dtype != spec.dtype:
        raise BuildError(
            Failure.CHECKPOINT_MISMATCH,
            f"the checkpoint's dtype is {dtype!r} but spec.engine.llm.dtype is {spec.dtype!r}: convert the model "
            f"with convert_checkpoint.py --dtype {spec.dtype}, or set spec.engine.llm.dtype to {dtype!r}",
        )
    mapping = config.get("mapping") or {}
    ranks = mapping.get("world_size", mapping.get("tp_size", 1)) if isinstance(mapping, dict) else 1
    if ranks != spec.tensor_parallel:
        raise BuildError(
            Failure.CHECKPOINT_MISMATCH,
            f"the checkpoint is split for {ranks} ranks (mapping.world_size) but the engine serves on "
            f"{spec.tensor_parallel} GPU: convert the model with convert_checkpoint.py --tp_size 1 --pp_size 1",
        )


def key_inputs(
    spec: TrtllmBuildSpec,
    *,
    model_name: str,
    gpu_product: str,
    model_digest: str,
    tensorrt_version: str,
    tensorrt_llm_version: str,
    model_revision: str = "",
) -> cachekey.KeyInputs:
    """The cache key's inputs of a TensorRT-LLM build: the key recipe's, with TensorRT-LLM's version and every
    build option. The operator and the builder both go through it."""
    return cachekey.KeyInputs(
        backend=BACKEND,
        model_digest=model_digest,
        model_name=model_name,
        precision=spec.dtype or "checkpoint",
        profile=(1, spec.max_batch_size, spec.max_batch_size),
        gpu_product=gpu_product,
        tensorrt_version=tensorrt_version,
        tensorrt_llm_version=tensorrt_llm_version,
        model_revision=model_revision,
        llm=spec.options(),
    )


def run_llm_build(
    req: LlmBuildRequest,
    machine: LlmMachine,
    scratch: Path,
    *,
    clock: Callable[[], float],
    run: Runner = run_streaming,
) -> BuildOutcome:
    """Build (or find) the engine entry of `req`. Raises BuildError on every failure."""
    from tailtune.engine_builder.build import BuildOutcome

    validate_spec(req.spec)
    if not req.gpu_product:
        raise BuildError(Failure.INVALID_ARGUMENTS, "a TensorRT-LLM engine needs --gpu-product")
    if machine.gpu is None:
        raise BuildError(Failure.GPU_MISMATCH, "no GPU visible to the build Job")
    gpu.check_gpu_product(machine.gpu, req.gpu_product)
    executable = shutil.which(TRTLLM_BUILD)
    if executable is None or not machine.tensorrt_llm_version:
        raise BuildError(
            Failure.BUILD_FAILED,
            f"{TRTLLM_BUILD} is not installed in this image (not on PATH, or no tensorrt_llm package): use a "
            "builder image with TensorRT-LLM (pip install tensorrt_llm installs trtllm-build)",
        )

    key = req.cache_key
    if key is None and req.sha256 is not None:
        key = _key(req, fetch.normalize_sha256(req.sha256), machine)
    if key is not None and (hit := store.read_metadata(req.store, key)) is not None:
        return BuildOutcome(cache_key=key, store_hit=True, entry=req.store / key, metadata=hit)

    checkpoint = fetch_checkpoint(req, machine, scratch)
    check_checkpoint(checkpoint.config, req.spec)
    if key is None:
        key = _key(req, checkpoint.sha256, machine)
        if (hit := store.read_metadata(req.store, key)) is not None:
            return BuildOutcome(cache_key=key, store_hit=True, entry=req.store / key, metadata=hit)

    started = clock()
    output = scratch / "engine-out"
    timing_cache = (
        store.timing_cache_path(req.store, f"llm-{machine.tensorrt_llm_version}", req.gpu_product)
        if req.timing_cache
        else None
    )
    if timing_cache is not None:
        timing_cache.parent.mkdir(parents=True, exist_ok=True)
    argv = trtllm_build_argv(checkpoint.path, output, req.spec, executable=executable, timing_cache=timing_cache)
    status, tail = run(argv)
    check_build_result(status, tail, output)
    engine_bytes = sum(p.stat().st_size for p in output.rglob("*.engine"))
    metadata = build_metadata(
        req,
        key=key,
        machine=machine,
        model_digest=checkpoint.sha256,
        engine_bytes=engine_bytes,
        build_seconds=clock() - started,
    )
    entry = store.publish(
        req.store,
        key,
        model_name=req.model_name,
        backend=BACKEND,
        write_artifact=lambda dest: shutil.copytree(output, dest),
        metadata=metadata,
    )
    return BuildOutcome(cache_key=key, store_hit=False, entry=entry, metadata=metadata)


def check_build_result(status: int, tail: Sequence[str], output: Path) -> None:
    """Judge trtllm-build's run: its exit status, an out-of-memory in its output, an engine actually written."""
    said = next((line.strip() for line in reversed(tail) if line.strip()), "no output")
    if status != 0:
        failure = Failure.OUT_OF_MEMORY if any(_OOM.search(line) for line in tail) else Failure.BUILD_FAILED
        raise BuildError(failure, f"{TRTLLM_BUILD} exited with status {status}: {said}", details=list(tail))
    if not (output / "rank0.engine").is_file() or not (output / "config.json").is_file():
        raise BuildError(
            Failure.BUILD_FAILED,
            f"{TRTLLM_BUILD} exited 0 but wrote no engine (rank0.engine and config.json) into {output}: {said}",
            details=list(tail),
        )


def build_metadata(
    req: LlmBuildRequest, *, key: str, machine: LlmMachine, model_digest: str, engine_bytes: int, build_seconds: float
) -> dict[str, Any]:
    """The entry's metadata.json, in the fields `cli.build_report` reads. Pure."""
    return {
        "schema": 1,
        "cacheKey": key,
        "backend": BACKEND,
        "modelName": req.model_name,
        "modelVersion": store.MODEL_VERSION,
        "artifact": f"{req.model_name}/{store.MODEL_VERSION}/{ENGINE_DIR}",
        "modelUri": fetch.redact(req.checkpoint_uri),
        "modelDigest": f"sha256:{model_digest}",
        "tensorrtVersion": machine.tensorrt_version or None,
        "tensorrtLlmVersion": machine.tensorrt_llm_version,
        "gpu": (
            {"product": req.gpu_product, "name": machine.gpu.name, "computeCapability": machine.gpu.compute_capability}
            if machine.gpu
            else None
        ),
        "llm": req.spec.options(),
        "maxBatchSize": req.spec.max_batch_size,
        "engineBytes": engine_bytes,
        "buildSeconds": round(build_seconds, 3),
        "inputs": [],
        "outputs": [],
        "builderVersion": machine.builder_version,
    }


def _key(req: LlmBuildRequest, model_digest: str, machine: LlmMachine) -> str:
    return cachekey.engine_key(
        key_inputs(
            req.spec,
            model_name=req.model_name,
            gpu_product=req.gpu_product,
            model_digest=model_digest,
            tensorrt_version=machine.tensorrt_version,
            tensorrt_llm_version=machine.tensorrt_llm_version,
        )
    )


def tensorrt_llm_version() -> str:
    """The installed TensorRT-LLM's version from its package metadata (no import: that needs a GPU), or ""."""
    for dist in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


# ---- the CLI's subcommand -----------------------------------------------------------------------------------


def add_command(commands: Any) -> None:
    """`build-llm`: the subparser of `python -m tailtune.engine_builder` (commands: argparse's subparsers)."""
    cmd = commands.add_parser("build-llm", help="build a TensorRT-LLM engine with trtllm-build into the engine store")
    cmd.add_argument("--checkpoint-uri", required=True, help="TensorRT-LLM checkpoint: a folder, or a tar of one")
    cmd.add_argument("--sha256", help="expected digest (an archive's bytes; a folder's tree_sha256)")
    cmd.add_argument("--model-name", required=True, help="the Triton model name (its folder in the store)")
    cmd.add_argument("--gpu-product", default="", help="nvidia.com/gpu.product the engine is for")
    cmd.add_argument("--store", type=Path, required=True, help="the engine store (a mounted PVC)")
    cmd.add_argument("--cache-key", help="store the entry under this key (the operator's) instead of computing it")
    cmd.add_argument("--max-batch-size", type=int, default=TrtllmBuildSpec.max_batch_size)
    cmd.add_argument("--max-num-tokens", type=int, default=TrtllmBuildSpec.max_num_tokens)
    cmd.add_argument("--max-input-len", type=int, default=TrtllmBuildSpec.max_input_len)
    cmd.add_argument("--max-seq-len", type=int, help="default: the checkpoint's max_position_embeddings")
    cmd.add_argument("--dtype", help="the checkpoint's dtype the build expects (default: whatever it has)")
    cmd.add_argument("--tensor-parallel", type=int, default=1)
    cmd.add_argument("--timing-cache", action="store_true", help="load and save the store's timing cache")
    cmd.add_argument("--fetch-timeout", type=float, default=60.0, help="seconds without data before giving up")
    cmd.add_argument("--scratch", type=Path, help="where remote checkpoints are unpacked (default: a temp dir)")
    cmd.add_argument("--termination-log", type=Path, help="default /dev/termination-log if it exists")
    # The ONNX build's timing flag: a TensorRT-LLM build times nothing, so it is taken and ignored.
    cmd.add_argument("--no-timing", action="store_true", help=argparse.SUPPRESS)


def request_from_args(args: argparse.Namespace) -> LlmBuildRequest:
    """The build request of the parsed `build-llm` flags."""
    return LlmBuildRequest(
        checkpoint_uri=args.checkpoint_uri,
        model_name=args.model_name,
        store=args.store,
        gpu_product=args.gpu_product,
        spec=TrtllmBuildSpec(
            max_batch_size=args.max_batch_size,
            max_num_tokens=args.max_num_tokens,
            max_input_len=args.max_input_len,
            max_seq_len=args.max_seq_len,
            dtype=args.dtype,
            tensor_parallel=args.tensor_parallel,
        ),
        sha256=args.sha256,
        cache_key=args.cache_key,
        timing_cache=args.timing_cache,
    )


def machine_here(pvc_root: Path, builder_version: str, fetch_timeout_s: float) -> LlmMachine:
    """What this Job's machine has: TensorRT-LLM's and TensorRT's versions, and the GPU."""
    from tailtune.engine_builder import trt  # imports onnx tooling, which the operator lacks

    return LlmMachine(
        tensorrt_llm_version=tensorrt_llm_version(),
        tensorrt_version=trt.tensorrt_version() or "",
        gpu=gpu.detect_gpu(),
        pvc_root=pvc_root,
        builder_version=builder_version,
        fetch_timeout_s=fetch_timeout_s,
    )


def builder_flags(spec: TrtllmBuildSpec) -> list[str]:
    """The `build-llm` flags of `spec` (the operator's side of `request_from_args`). Pure."""
    flags = [
        "--max-batch-size", str(spec.max_batch_size),
        "--max-num-tokens", str(spec.max_num_tokens),
        "--max-input-len", str(spec.max_input_len),
        "--tensor-parallel", str(spec.tensor_parallel),
    ]  # fmt: skip
    if spec.max_seq_len is not None:
        flags += ["--max-seq-len", str(spec.max_seq_len)]
    if spec.dtype is not None:
        flags += ["--dtype", spec.dtype]
    return flags

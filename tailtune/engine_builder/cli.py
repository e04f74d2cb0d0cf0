"""`python -m tailtune.engine_builder {build,build-llm,key} ...`: the entrypoint of the engine build Job.

Every failure exits with its class's code (`errors.EXIT_CODES`) and writes `<Reason>: <message>`
to the termination log, which Kubernetes shows on the pod; success writes a JSON report (`build_report`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from tailtune.engine_builder import build, fetch, gpu, trt, trtllm
from tailtune.engine_builder.errors import EXIT_OK, REASON_OK, BuildError, Failure

DEFAULT_TERMINATION_LOG = Path("/dev/termination-log")
# Kubernetes keeps at most 4096 bytes of a termination message.
TERMINATION_LOG_LIMIT = 4096
PVC_ROOT_ENV = "TAILTUNE_PVC_ROOT"

log = logging.getLogger("tailtune.engine_builder")


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """Raises on bad flags, so they end in the termination log like every other failure."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise _UsageError(message)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    termination_log = _termination_log_flag(argv)
    try:
        args = _parser().parse_args(argv)
        if args.command == "build-llm":
            outcome = _build_llm(args)
        else:
            request = _request(args)
            if args.command == "key":
                print(_key(args, request))
                return EXIT_OK
            outcome = _build(args, request)
    except _UsageError as exc:
        return _fail(BuildError(Failure.INVALID_ARGUMENTS, str(exc)), termination_log)
    except BuildError as exc:
        return _fail(exc, termination_log)
    except Exception as exc:  # a bug; still tell Kubernetes what happened
        log.exception("unexpected error")
        return _fail(BuildError(Failure.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"), termination_log)
    return _succeed(outcome, termination_log)


def _succeed(outcome: build.BuildOutcome, termination_log: Path | None) -> int:
    """Log the outcome, print it as JSON and write the build report where Kubernetes reads it."""
    if outcome.store_hit:
        summary = f"{outcome.cache_key} found in the store at {outcome.entry}; build skipped"
    else:
        summary = f"{outcome.cache_key} built in {outcome.metadata['buildSeconds']:g} s into {outcome.entry}"
    log.info("%s", summary)
    print(json.dumps({"cacheKey": outcome.cache_key, "storeHit": outcome.store_hit, "entry": str(outcome.entry)}))
    write_termination_log(termination_log, build_report(outcome.metadata, summary))
    return EXIT_OK


def build_report(metadata: Mapping[str, Any], summary: str) -> str:
    """The success termination message: JSON the operator reads for the engine's I/O and versions. Pure.

    Tensor dims drop the batch dim (Triton's convention); a tensor whose rank is unknown is left out.
    """

    def tensors(key: str) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for t in metadata.get(key) or []:
            dims = t.get("dims")
            if dims and t.get("dtype"):
                out.append({"name": t["name"], "dataType": t["dtype"], "dims": list(dims[1:]) or [1]})
        return out

    gpu = metadata.get("gpu") or {}
    report = {
        "reason": REASON_OK,
        "message": summary,
        "cacheKey": metadata.get("cacheKey"),
        "tensorrtVersion": metadata.get("tensorrtVersion"),
        "gpuProduct": gpu.get("product"),
        "location": metadata.get("artifact"),
        "modelDigest": metadata.get("modelDigest"),
        "inputs": tensors("inputs"),
        "outputs": tensors("outputs"),
    }
    if metadata.get("engineBytes") is not None:
        report["engineBytes"] = metadata["engineBytes"]
    if metadata.get("serviceTime"):
        report["serviceTime"] = [{"batch": p["batch"], "ms": p["ms"]} for p in metadata["serviceTime"]]
    # Within Kubernetes' limit: drop the service time first (the tuner can measure it live), then all but the summary.
    for candidate in (report, {k: v for k, v in report.items() if k != "serviceTime"}):
        text = json.dumps(candidate, separators=(",", ":"))
        if len(text.encode()) <= TERMINATION_LOG_LIMIT:
            return text
    return json.dumps({"reason": REASON_OK, "message": summary})


def format_termination_message(error: BuildError, limit: int = TERMINATION_LOG_LIMIT) -> str:
    """`<Reason>: <message>` plus as many detail lines as fit in `limit` bytes. Pure."""
    text = str(error)
    if len(text.encode()) > limit:
        return text.encode()[: limit - 3].decode(errors="ignore") + "..."
    for line in error.details:
        candidate = f"{text}\n{line}"
        if len(candidate.encode()) > limit:
            break
        text = candidate
    return text


def write_termination_log(path: Path | None, text: str) -> None:
    """Write the message where Kubernetes reads it; never fail the Job over it."""
    if path is None:
        return
    try:
        path.write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        log.warning("cannot write the termination log %s: %s", path, exc)


def _fail(error: BuildError, termination_log: Path | None) -> int:
    message = format_termination_message(error)
    print(str(error), file=sys.stderr)
    for line in error.details:
        print(f"  {line}", file=sys.stderr)
    write_termination_log(termination_log, message)
    return error.failure.exit_code


def _termination_log_flag(argv: Sequence[str]) -> Path | None:
    """Read --termination-log before parsing, so even bad flags are reported there.

    Without the flag the Kubernetes path is used only where it exists, never created.
    """
    for index, arg in enumerate(argv):
        if arg == "--termination-log" and index + 1 < len(argv):
            return Path(argv[index + 1])
        if arg.startswith("--termination-log="):
            return Path(arg.split("=", 1)[1])
    return DEFAULT_TERMINATION_LOG if DEFAULT_TERMINATION_LOG.exists() else None


def _parser() -> _Parser:
    parser = _Parser(prog="python -m tailtune.engine_builder", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser("build", help="fetch, check and build the model into the engine store")
    key_cmd = commands.add_parser("key", help="print the engine cache key of these flags on this machine")
    for cmd in (build_cmd, key_cmd):
        cmd.add_argument("--model-uri", required=True, help="https://, http://, s3://, gs://, pvc://, file:// or path")
        cmd.add_argument("--sha256", help="expected sha256 of the model file (hex, or sha256:hex)")
        cmd.add_argument("--backend", required=True, choices=build.BACKENDS)
        cmd.add_argument("--precision", default="fp32", choices=gpu.PRECISIONS)
        cmd.add_argument("--max-batch", type=int, default=1, help="max of the batch dim (profile max)")
        cmd.add_argument("--opt-batch", type=int, help="batch size TensorRT tunes for (default: --max-batch)")
        cmd.add_argument("--workspace-mib", type=int, default=4096)
        cmd.add_argument("--opt-level", type=int, default=3, help="builder optimization level, 0-5")
        cmd.add_argument("--timing-cache", action="store_true", help="load and save the store's timing cache")
        cmd.add_argument("--calibration-cache", help="int8 calibration cache (URI or path)")
        cmd.add_argument("--gpu-product", default="", help="nvidia.com/gpu.product the engine is for")
        cmd.add_argument("--model-name", required=True, help="the Triton model name (its folder in the store)")
        cmd.add_argument(
            "--dim",
            action="append",
            default=[],
            metavar="INPUT:AXIS=MIN,OPT,MAX",
            help="range of another dynamic input dim (TensorRT profile); repeat per dim",
        )
        cmd.add_argument("--fetch-timeout", type=float, default=60.0, help="seconds without data before giving up")
        cmd.add_argument("--scratch", type=Path, help="where remote models are downloaded (default: a temp dir)")
        cmd.add_argument("--termination-log", type=Path, help=f"default {DEFAULT_TERMINATION_LOG} if it exists")
    build_cmd.add_argument("--store", type=Path, required=True, help="the engine store (a mounted PVC)")
    build_cmd.add_argument(
        "--cache-key", help="store the entry under this key (the operator's) instead of computing it"
    )
    build_cmd.add_argument(
        "--no-timing",
        dest="timing",
        action="store_false",
        help="do not time the engine at batch sizes 1, 2, 4, ... --max-batch after building (serviceTime)",
    )
    trtllm.add_command(commands)
    key_cmd.add_argument("--tensorrt-version", help="default: the installed TensorRT")
    key_cmd.add_argument("--compute-capability", help="default: the visible GPU's, from nvidia-smi")
    return parser


def _request(args: argparse.Namespace) -> build.BuildRequest:
    if args.sha256 is not None:
        try:
            fetch.normalize_sha256(args.sha256)
        except ValueError as exc:
            raise _UsageError(f"--sha256: {exc}") from None
    return build.BuildRequest(
        model_uri=args.model_uri,
        backend=args.backend,
        model_name=args.model_name,
        store=getattr(args, "store", None) or Path("."),
        precision=args.precision,
        max_batch=args.max_batch,
        opt_batch=args.opt_batch if args.opt_batch is not None else args.max_batch,
        workspace_mib=args.workspace_mib,
        opt_level=args.opt_level,
        timing_cache=args.timing_cache,
        sha256=args.sha256,
        calibration_cache=args.calibration_cache,
        gpu_product=args.gpu_product,
        dim_ranges=dict(_dim_range(text) for text in args.dim),
        cache_key=getattr(args, "cache_key", None),
        measure_service_time=getattr(args, "timing", True),
    )


def _dim_range(text: str) -> tuple[tuple[str, int], tuple[int, int, int]]:
    """`tokens:1=1,128,512` -> (("tokens", 1), (1, 128, 512))."""
    target, _, values = text.rpartition("=")
    name, _, axis = target.rpartition(":")
    parts = values.split(",")
    if not name or not axis.isdigit() or len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise _UsageError(f"--dim {text!r}: expected INPUT:AXIS=MIN,OPT,MAX")
    lo, opt, hi = (int(p) for p in parts)
    return (name, int(axis)), (lo, opt, hi)


def _machine(args: argparse.Namespace, *, tensorrt_version: str | None, gpu_info: gpu.GpuInfo | None) -> build.Machine:
    return build.Machine(
        tensorrt_version=tensorrt_version or "",
        gpu=gpu_info,
        pvc_root=Path(os.environ.get(PVC_ROOT_ENV) or fetch.DEFAULT_PVC_ROOT),
        builder_version=_builder_version(),
        fetch_timeout_s=args.fetch_timeout,
    )


def _build(args: argparse.Namespace, request: build.BuildRequest) -> build.BuildOutcome:
    build.validate_request(request)
    on_gpu = request.backend == "tensorrt"
    machine = _machine(
        args,
        tensorrt_version=trt.tensorrt_version() if on_gpu else None,
        gpu_info=gpu.detect_gpu() if on_gpu else None,
    )
    with _scratch(args.scratch) as scratch:
        return build.run_build(request, machine, Path(scratch), time.monotonic)


def _build_llm(args: argparse.Namespace) -> build.BuildOutcome:
    request = trtllm.request_from_args(args)
    trtllm.validate_spec(request.spec)
    pvc_root = Path(os.environ.get(PVC_ROOT_ENV) or fetch.DEFAULT_PVC_ROOT)
    machine = trtllm.machine_here(pvc_root, _builder_version(), args.fetch_timeout)
    with _scratch(args.scratch) as scratch:
        return trtllm.run_llm_build(request, machine, Path(scratch), clock=time.monotonic)


def _key(args: argparse.Namespace, request: build.BuildRequest) -> str:
    build.validate_request(request)
    on_gpu = request.backend == "tensorrt"
    gpu_info = None
    if on_gpu:
        if args.compute_capability:
            gpu_info = gpu.GpuInfo(name=request.gpu_product, compute_capability=args.compute_capability)
        else:
            gpu_info = gpu.detect_gpu()
    version = (args.tensorrt_version or trt.tensorrt_version()) if on_gpu else None
    machine = _machine(args, tensorrt_version=version, gpu_info=gpu_info)
    with _scratch(args.scratch) as scratch:
        return build.request_key(request, machine, Path(scratch))


def _scratch(path: Path | None) -> tempfile.TemporaryDirectory[str]:
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(prefix="tailtune-build-", dir=path)


def _builder_version() -> str:
    try:
        return importlib.metadata.version("tailtune")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"

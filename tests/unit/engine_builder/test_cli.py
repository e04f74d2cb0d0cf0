"""The builder CLI run as the Job runs it: exit codes, termination log, store layout, store hits."""

from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from tailtune.engine_builder.errors import EXIT_CODES, Failure

from .conftest import Cli, Models


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ort_args(uri: str, store: Path, *extra: str) -> list[str]:
    return [
        "build",
        "--model-uri",
        uri,
        "--backend",
        "onnxruntime",
        "--max-batch",
        "8",
        "--opt-batch",
        "4",
        "--model-name",
        "relu",
        "--store",
        str(store),
        *extra,
    ]


def _trt_args(uri: str, store: Path, *extra: str) -> list[str]:
    return [
        "build",
        "--model-uri",
        uri,
        "--backend",
        "tensorrt",
        "--precision",
        "fp16",
        "--max-batch",
        "8",
        "--opt-batch",
        "4",
        "--gpu-product",
        "Tesla-T4",
        "--model-name",
        "relu",
        "--store",
        str(store),
        *extra,
    ]


def test_onnxruntime_layout_metadata_and_store_hit(cli: Cli, models: Models, http_url: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    uri = f"{http_url}/dynamic.onnx"
    digest = hashlib.sha256(models.dynamic.read_bytes()).hexdigest()

    first = cli.run(*_ort_args(uri, store, "--sha256", digest))
    assert first.code == 0, first.stderr
    out = json.loads(first.stdout)
    key = out["cacheKey"]
    assert out == {"cacheKey": key, "storeHit": False, "entry": str(store / key)}
    report = json.loads(first.termination_log)
    assert report["reason"] == "EngineReady" and report["message"].startswith(f"{key} built in ")
    assert report["cacheKey"] == key and report["location"] == "relu/1/model.onnx"
    # What the operator renders the Triton config from: dims without the batch dim.
    assert report["inputs"] == [{"name": "x", "dataType": "TYPE_FP32", "dims": [4]}]
    assert report["outputs"] == [{"name": "y", "dataType": "TYPE_FP32", "dims": [4]}]
    # The engine timed at the ladder 1, 2, 4 ... --max-batch: the build's service-time curve.
    assert [p["batch"] for p in report["serviceTime"]] == [1, 2, 4, 8]
    assert all(p["ms"] > 0 and round(p["ms"], 3) == p["ms"] for p in report["serviceTime"])
    # The engine's size: what a hot reload needs free on the GPU a second time.
    assert report["engineBytes"] == models.dynamic.stat().st_size

    entry = store / key
    assert sorted(p.relative_to(entry).as_posix() for p in entry.rglob("*")) == [
        "metadata.json",
        "relu",
        "relu/1",
        "relu/1/model.onnx",
    ]
    assert (entry / "relu/1/model.onnx").read_bytes() == models.dynamic.read_bytes()
    metadata = json.loads((entry / "metadata.json").read_text())
    assert metadata["serviceTime"] == report["serviceTime"]
    volatile = {"buildSeconds": 0, "builderVersion": "x", "onnxruntimeVersion": "x", "serviceTime": "x"}
    assert metadata | volatile == {
        "schema": 1,
        "cacheKey": key,
        "backend": "onnxruntime",
        "modelName": "relu",
        "modelVersion": "1",
        "artifact": "relu/1/model.onnx",
        "modelUri": uri,
        "modelDigest": f"sha256:{digest}",
        "tensorrtVersion": None,
        "gpu": None,
        "precision": "fp32",
        "maxBatchSize": 8,
        "profile": {"min": 1, "opt": 4, "max": 8},
        "dimRanges": [],
        "flags": {"workspaceMiB": 4096, "optLevel": 3, "timingCache": False},
        "opset": 17,
        "inputs": [{"name": "x", "dtype": "TYPE_FP32", "onnxDtype": "FLOAT", "dims": [-1, 4]}],
        "outputs": [{"name": "y", "dtype": "TYPE_FP32", "onnxDtype": "FLOAT", "dims": [-1, 4]}],
        "buildSeconds": 0,
        "builderVersion": "x",
        "onnxruntimeVersion": "x",
        "serviceTime": "x",
        "engineBytes": models.dynamic.stat().st_size,
    }
    assert metadata["onnxruntimeVersion"] == onnxruntime.__version__

    # What the store holds runs in onnxruntime.
    session = onnxruntime.InferenceSession(str(entry / "relu/1/model.onnx"), providers=["CPUExecutionProvider"])
    batch = np.array([[-1.0, 2.0, -3.0, 4.0]] * 3, dtype=np.float32)
    np.testing.assert_array_equal(session.run(["y"], {"x": batch})[0], np.maximum(batch, 0))

    # Same request again: a hit, even without --sha256 (the model is fetched and hashed, not rebuilt).
    written = (entry / "metadata.json").stat().st_mtime_ns
    again = cli.run(*_ort_args(uri, store))
    assert again.code == 0, again.stderr
    assert json.loads(again.stdout)["storeHit"] is True
    assert json.loads(again.termination_log)["message"] == f"{key} found in the store at {entry}; build skipped"
    assert json.loads(again.termination_log)["serviceTime"] == metadata["serviceTime"]  # a hit reports it too
    assert (entry / "metadata.json").stat().st_mtime_ns == written
    assert json.loads(again.termination_log)["engineBytes"] == report["engineBytes"]
    # An entry an older builder left without the size: a hit measures its artifact.
    (entry / "metadata.json").write_text(json.dumps({k: v for k, v in metadata.items() if k != "engineBytes"}))
    old = cli.run(*_ort_args(uri, store))
    assert old.code == 0, old.stderr
    assert json.loads(old.termination_log)["engineBytes"] == report["engineBytes"]

    # With --sha256 the key is known up front: a hit needs no fetch, so a dead URI does not matter.
    dead = f"http://127.0.0.1:{_closed_port()}/dynamic.onnx"
    offline = cli.run(*_ort_args(dead, store, "--sha256", digest))
    assert offline.code == 0, offline.stderr
    assert json.loads(offline.stdout) == {"cacheKey": key, "storeHit": True, "entry": str(entry)}

    # The key subcommand agrees.
    printed = cli.run("key", *_ort_args(str(models.dynamic), store)[1:-2])
    assert printed.code == 0, printed.stderr
    assert printed.stdout.strip() == key


def test_no_timing_leaves_the_service_time_out(cli: Cli, models: Models, tmp_path: Path) -> None:
    done = cli.run(*_ort_args(str(models.dynamic), tmp_path / "store", "--no-timing"))
    assert done.code == 0, done.stderr
    report = json.loads(done.termination_log)
    assert "serviceTime" not in report
    assert "serviceTime" not in json.loads((Path(report["message"].split(" into ")[1]) / "metadata.json").read_text())


def test_operator_key_names_the_entry(cli: Cli, models: Models, tmp_path: Path) -> None:
    store = tmp_path / "store"
    done = cli.run(*_ort_args(str(models.string), store, "--cache-key", "eng-from-operator"))
    assert done.code == 0, done.stderr
    assert (store / "eng-from-operator" / "relu/1/model.onnx").read_bytes() == models.string.read_bytes()


def test_tensorrt_key_without_a_gpu_machine(cli: Cli, models: Models) -> None:
    args = [
        "key",
        "--model-uri",
        str(models.dynamic),
        "--backend",
        "tensorrt",
        "--precision",
        "fp16",
        "--max-batch",
        "8",
        "--gpu-product",
        "NVIDIA-H200",
        "--model-name",
        "relu",
    ]
    first = cli.run(*args, "--tensorrt-version", "10.13.0.35", "--compute-capability", "9.0")
    other = cli.run(*args, "--tensorrt-version", "10.12.0.36", "--compute-capability", "9.0")
    assert first.code == other.code == 0, first.stderr + other.stderr
    assert first.stdout.strip().startswith("eng-") and first.stdout != other.stdout
    missing = cli.run(*args, "--compute-capability", "9.0")
    assert (missing.code, missing.termination_log) == (
        18,
        "BuildFailed: TensorRT is not installed in this image (import tensorrt failed)\n",
    )


@pytest.mark.parametrize(
    ("case", "failure", "message"),
    [
        ("http_404", Failure.FETCH_FAILED, "GET {http}/missing.onnx: HTTP 404 File not found"),
        ("unreachable", Failure.FETCH_FAILED, "cannot reach {dead}: "),
        ("missing_file", Failure.FETCH_FAILED, "{models}/missing.onnx: no such file {models}/missing.onnx"),
        ("digest", Failure.DIGEST_MISMATCH, "{http}/dynamic.onnx has sha256 {digest}, expected " + "0" * 64),
        ("garbage", Failure.CORRUPT_MODEL, "model.onnx: The model does not have an ir_version set properly."),
        ("custom_op", Failure.UNSUPPORTED_OP, "onnxruntime cannot load the model: "),
        ("unknown_op", Failure.UNSUPPORTED_OP, "unknown_op.onnx: No Op registered for NotAnOp"),
        ("complex", Failure.UNSUPPORTED_TENSOR, "input 'z' has dtype COMPLEX64, which Triton cannot serve"),
        ("static_batch", Failure.UNSUPPORTED_TENSOR, "input 'x' dim 0 is fixed at 1, so it cannot batch up to 8"),
        ("ort_fp16", Failure.PRECISION_UNSUPPORTED, "onnxruntime serves the ONNX model as exported"),
        ("trt_bf16_on_t4", Failure.PRECISION_UNSUPPORTED, "bf16 needs compute capability 8.0 or newer"),
        ("trt_int8_no_cache", Failure.PRECISION_UNSUPPORTED, "int8 needs a calibration cache"),
        ("trt_wrong_gpu", Failure.GPU_MISMATCH, "the engine is for Tesla-T4 but this Job runs on NVIDIA L4"),
        ("trt_no_gpu", Failure.GPU_MISMATCH, "no GPU visible: nvidia-smi failed: "),
        ("trt_not_installed", Failure.BUILD_FAILED, "TensorRT is not installed in this image"),
        ("opt_over_max", Failure.INVALID_ARGUMENTS, "need 1 <= opt batch (16) <= max batch (8)"),
        ("no_model_uri", Failure.INVALID_ARGUMENTS, "the following arguments are required: --model-uri"),
        ("bad_dim", Failure.INVALID_ARGUMENTS, "--dim 'x=1,2,3': expected INPUT:AXIS=MIN,OPT,MAX"),
        ("store_is_a_file", Failure.STORE_FAILED, "cannot read {tmp}/store-file/eng-"),
    ],
)
def test_every_failure_exits_with_its_code_and_says_why(
    cli: Cli, models: Models, http_url: str, tmp_path: Path, case: str, failure: Failure, message: str
) -> None:
    store = tmp_path / "store"
    dead = f"http://127.0.0.1:{_closed_port()}/dynamic.onnx"
    args = {
        "http_404": _ort_args(f"{http_url}/missing.onnx", store),
        "unreachable": _ort_args(dead, store),
        "missing_file": _ort_args(str(models.root / "missing.onnx"), store),
        "digest": _ort_args(f"{http_url}/dynamic.onnx", store, "--sha256", "0" * 64),
        "garbage": _ort_args(f"{http_url}/garbage.onnx", store),
        "custom_op": _ort_args(str(models.custom_op), store),
        "unknown_op": _ort_args(str(models.unknown_op), store),
        "complex": _ort_args(str(models.complex64), store),
        "static_batch": _ort_args(str(models.static1), store),
        "ort_fp16": _ort_args(str(models.dynamic), store, "--precision", "fp16"),
        "trt_bf16_on_t4": _trt_args(str(models.dynamic), store, "--precision", "bf16"),
        "trt_int8_no_cache": _trt_args(str(models.dynamic), store, "--precision", "int8"),
        "trt_wrong_gpu": _trt_args(str(models.dynamic), store),
        "trt_no_gpu": _trt_args(str(models.dynamic), store),
        "trt_not_installed": _trt_args(str(models.dynamic), store),
        "opt_over_max": _ort_args(str(models.dynamic), store, "--opt-batch", "16"),
        "no_model_uri": ["build", "--backend", "onnxruntime", "--model-name", "m", "--store", str(store)],
        "bad_dim": _ort_args(str(models.dynamic), store, "--dim", "x=1,2,3"),
        "store_is_a_file": _ort_args(str(models.dynamic), tmp_path / "store-file"),
    }[case]
    if case.startswith("trt_") and case != "trt_no_gpu":
        cli.fake_nvidia_smi("NVIDIA L4, 8.9" if case == "trt_wrong_gpu" else "Tesla T4, 7.5")
    (tmp_path / "store-file").write_text("not a folder")
    expected = message.format(
        http=http_url,
        dead=dead,
        models=models.root,
        tmp=tmp_path,
        digest=hashlib.sha256(models.dynamic.read_bytes()).hexdigest(),
    )

    done = cli.run(*args)

    assert done.code == failure.exit_code, done.stderr
    assert done.termination_log.startswith(f"{failure.reason}: {expected}"), done.termination_log
    assert f"{failure.reason}: {expected}" in done.stderr
    assert not any(store.glob("eng-*")), "a failed build left an entry in the store"


def test_exit_codes_are_distinct_and_documented() -> None:
    assert len({f.exit_code for f in Failure}) == len(Failure)
    assert set(EXIT_CODES) == {0} | {f.exit_code for f in Failure}
    assert all(0 < f.exit_code < 126 for f in Failure)

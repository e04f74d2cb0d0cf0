"""The TensorRT-LLM build path, run for real up to `trtllm-build`, which is a FAKE here (no GPU, no TensorRT-LLM):
a script named FAKE_TRTLLM_BUILD that writes the files trtllm-build writes, or fails as it can fail."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tailtune.engine_builder import cachekey, trtllm
from tailtune.engine_builder.build import BuildOutcome
from tailtune.engine_builder.errors import BuildError, Failure
from tailtune.engine_builder.gpu import GpuInfo
from tailtune.engine_builder.trtllm import LlmBuildRequest, LlmMachine, TrtllmBuildSpec

from .conftest import Cli

# A FAKE trtllm-build: records its argv and writes rank0.engine + config.json into --output_dir, or fails the way
# FAKE_TRTLLM_MODE says (exit 1 with an error line, an out-of-memory, or exit 0 without writing an engine).
FAKE_TRTLLM_BUILD = """#!{python}
# FAKE trtllm-build for tests: no TensorRT-LLM here.
import json, os, sys
argv = sys.argv[1:]
out = argv[argv.index("--output_dir") + 1]
mode = os.environ.get("FAKE_TRTLLM_MODE", "ok")
with open(os.environ["FAKE_TRTLLM_CALLS"], "a") as calls:
    calls.write(json.dumps(argv) + "\\n")
print("[TensorRT-LLM] FAKE build starting")
if mode == "fail":
    print("[TensorRT-LLM][ERROR] Unsupported architecture FooForCausalLM")
    sys.exit(1)
if mode == "oom":
    print("[TensorRT-LLM][ERROR] CUDA runtime error in cudaMalloc: out of memory")
    sys.exit(1)
if mode == "ok":
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "rank0.engine"), "wb") as f:
        f.write(b"FAKE-ENGINE" * 100)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({{"build_config": {{"max_num_tokens": int(argv[argv.index("--max_num_tokens") + 1])}}}}, f)
"""

L4 = GpuInfo(name="NVIDIA L4", compute_capability="8.9")
SPEC = TrtllmBuildSpec(max_batch_size=64, max_num_tokens=4096, max_input_len=2048, max_seq_len=4096, dtype="float16")


def checkpoint(root: Path, *, dtype: str = "float16", ranks: int = 1) -> Path:
    """A TensorRT-LLM checkpoint folder as convert_checkpoint.py lays it out (weights are stand-in bytes)."""
    root.mkdir(parents=True, exist_ok=True)
    config = {"architecture": "LlamaForCausalLM", "dtype": dtype, "mapping": {"world_size": ranks, "tp_size": ranks}}
    (root / "config.json").write_text(json.dumps(config))
    for rank in range(ranks):
        (root / f"rank{rank}.safetensors").write_bytes(b"weights" * 64)
    return root


@pytest.fixture
def fake_trtllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put the FAKE trtllm-build on PATH; returns the file where it records each call's argv."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    script = bin_dir / "trtllm-build"
    script.write_text(FAKE_TRTLLM_BUILD.format(python=sys.executable))
    script.chmod(0o755)
    calls = tmp_path / "trtllm-calls.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_TRTLLM_CALLS", str(calls))
    return calls


def machine(tmp_path: Path, **changes: object) -> LlmMachine:
    base = LlmMachine(
        tensorrt_llm_version="0.16.0",
        tensorrt_version="10.7.0",
        gpu=L4,
        pvc_root=tmp_path / "pvc",
        builder_version="test",
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def request(tmp_path: Path, uri: str, **changes: object) -> LlmBuildRequest:
    base = LlmBuildRequest(
        checkpoint_uri=uri, model_name="llama", store=tmp_path / "store", gpu_product="NVIDIA-L4", spec=SPEC
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def build(tmp_path: Path, req: LlmBuildRequest, mach: LlmMachine | None = None) -> BuildOutcome:
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    return trtllm.run_llm_build(req, mach or machine(tmp_path), scratch, clock=time.monotonic)


def test_argv_carries_every_limit_of_the_spec() -> None:
    argv = trtllm.trtllm_build_argv(Path("/ck"), Path("/out"), SPEC, timing_cache=Path("/s/t.cache"))
    assert argv == [
        "trtllm-build",
        "--checkpoint_dir", "/ck",
        "--output_dir", "/out",
        "--max_batch_size", "64",
        "--max_num_tokens", "4096",
        "--max_input_len", "2048",
        "--max_seq_len", "4096",
        "--kv_cache_type", "paged",
        "--use_paged_context_fmha", "enable",
        "--max_beam_width", "1",
        "--input_timing_cache", "/s/t.cache",
        "--output_timing_cache", "/s/t.cache",
    ]  # fmt: skip


def test_an_unset_max_seq_len_is_left_to_the_checkpoint() -> None:
    argv = trtllm.trtllm_build_argv(Path("/ck"), Path("/out"), TrtllmBuildSpec())
    assert "--max_seq_len" not in argv
    assert argv[argv.index("--max_batch_size") + 1] == "2048"  # trtllm-build's own default, passed explicitly


def _key(spec: TrtllmBuildSpec, **changes: str) -> str:
    given = {"tensorrt_version": "10.7.0", "tensorrt_llm_version": "0.16.0", "gpu_product": "NVIDIA-L4", **changes}
    return cachekey.engine_key(trtllm.key_inputs(spec, model_name="llama", model_digest="a" * 64, **given))


@pytest.mark.parametrize(
    "changes",
    [
        {"max_batch_size": 128},
        {"max_num_tokens": 8192},
        {"max_input_len": 1024},
        {"max_seq_len": None},
        {"max_seq_len": 8192},
        {"dtype": "bfloat16"},
        {"dtype": None},
    ],
)
def test_each_build_option_changes_the_key(changes: dict[str, object]) -> None:
    assert _key(dataclasses.replace(SPEC, **changes)) != _key(SPEC)  # type: ignore[arg-type]


def test_versions_change_the_key_and_other_backends_keep_theirs() -> None:
    assert _key(SPEC, tensorrt_llm_version="0.17.0") != _key(SPEC)
    assert _key(SPEC, tensorrt_version="10.8.0") != _key(SPEC)
    assert _key(SPEC, gpu_product="NVIDIA-H100-80GB-HBM3") != _key(SPEC)
    assert _key(SPEC, model_revision="2") != _key(SPEC)
    # The llm fields added to the recipe leave a TensorRT engine's key as it was (no flag, no change).
    plain = cachekey.KeyInputs(
        backend="tensorrt",
        model_digest="a" * 64,
        model_name="m",
        precision="fp16",
        profile=(1, 8, 32),
        gpu_product="NVIDIA-L4",
        tensorrt_version="10.7.0",
    )
    assert "tensorrt_llm_version" not in cachekey.key_arguments(plain)["flags"]
    assert not any(k.startswith("llm:") for k in cachekey.key_arguments(plain)["flags"])


def test_a_folder_checkpoint_builds_publishes_and_hits(tmp_path: Path, fake_trtllm: Path) -> None:
    ck = checkpoint(tmp_path / "ckpt")
    outcome = build(tmp_path, request(tmp_path, str(ck)))

    assert not outcome.store_hit
    engine = outcome.entry / "llama" / "1" / "engine"
    assert (engine / "rank0.engine").read_bytes().startswith(b"FAKE-ENGINE")
    assert json.loads((engine / "config.json").read_text())["build_config"]["max_num_tokens"] == 4096
    meta = json.loads((outcome.entry / "metadata.json").read_text())
    assert meta["artifact"] == "llama/1/engine" and meta["tensorrtLlmVersion"] == "0.16.0"
    assert meta["modelDigest"] == f"sha256:{trtllm.tree_sha256(ck)}"
    assert meta["engineBytes"] == 1100
    [argv] = [json.loads(line) for line in fake_trtllm.read_text().splitlines()]
    assert argv[argv.index("--checkpoint_dir") + 1] == str(ck)

    again = build(tmp_path, request(tmp_path, str(ck)))
    assert again.store_hit and again.cache_key == outcome.cache_key
    assert len(fake_trtllm.read_text().splitlines()) == 1, "a store hit ran trtllm-build again"


def test_a_tar_checkpoint_builds(tmp_path: Path, fake_trtllm: Path) -> None:
    """An archive is fetched and unpacked (a top folder inside it is found)."""
    ck = checkpoint(tmp_path / "src" / "llama-ckpt")
    archive = tmp_path / "ckpt.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(ck, arcname="llama-ckpt")
    outcome = build(tmp_path, request(tmp_path, f"file://{archive}"))
    assert (outcome.entry / "llama" / "1" / "engine" / "rank0.engine").is_file()
    [argv] = [json.loads(line) for line in fake_trtllm.read_text().splitlines()]
    assert Path(argv[argv.index("--checkpoint_dir") + 1]).name == "llama-ckpt"


@pytest.mark.parametrize(
    ("mode", "failure", "message"),
    [
        ("fail", Failure.BUILD_FAILED, "trtllm-build exited with status 1: [TensorRT-LLM][ERROR] Unsupported arch"),
        ("oom", Failure.OUT_OF_MEMORY, "trtllm-build exited with status 1: [TensorRT-LLM][ERROR] CUDA runtime"),
        ("noengine", Failure.BUILD_FAILED, "trtllm-build exited 0 but wrote no engine (rank0.engine and config"),
    ],
)
def test_a_failed_trtllm_build_says_why_and_leaves_no_entry(
    tmp_path: Path, fake_trtllm: Path, monkeypatch: pytest.MonkeyPatch, mode: str, failure: Failure, message: str
) -> None:
    monkeypatch.setenv("FAKE_TRTLLM_MODE", mode)
    with pytest.raises(BuildError) as err:
        build(tmp_path, request(tmp_path, str(checkpoint(tmp_path / "ckpt"))))
    assert err.value.failure is failure
    assert err.value.message.startswith(message), err.value.message
    assert any("FAKE build starting" in line for line in err.value.details)
    assert not any((tmp_path / "store").glob("eng-*"))


@pytest.mark.parametrize(
    ("make", "changes", "failure", "message"),
    [
        (lambda p: checkpoint(p, dtype="bfloat16"), {}, Failure.CHECKPOINT_MISMATCH, "dtype is 'bfloat16' but"),
        (lambda p: checkpoint(p, ranks=2), {}, Failure.CHECKPOINT_MISMATCH, "split for 2 ranks"),
        (lambda p: p.mkdir() or p, {}, Failure.CORRUPT_MODEL, "not a TensorRT-LLM checkpoint: no config.json"),
        (checkpoint, {"gpu_product": "NVIDIA-H100-80GB-HBM3"}, Failure.GPU_MISMATCH, "the engine is for NVIDIA-H1"),
        (checkpoint, {"sha256": "0" * 64}, Failure.DIGEST_MISMATCH, "the checkpoint folder's digest is sha256:"),
    ],
)
def test_a_checkpoint_that_is_not_the_spec_s_is_refused(
    tmp_path: Path, fake_trtllm: Path, make: object, changes: dict[str, object], failure: Failure, message: str
) -> None:
    ck = make(tmp_path / "ckpt")  # type: ignore[operator]
    with pytest.raises(BuildError) as err:
        build(tmp_path, request(tmp_path, str(ck), **changes))
    assert err.value.failure is failure
    assert message in err.value.message, err.value.message
    assert not fake_trtllm.exists(), "trtllm-build ran on a checkpoint the spec refuses"


def test_an_archive_that_is_no_tar_is_a_corrupt_model(tmp_path: Path, fake_trtllm: Path) -> None:
    junk = tmp_path / "ckpt.bin"
    junk.write_bytes(b"\x00not a tar" * 100)
    with pytest.raises(BuildError) as err:
        build(tmp_path, request(tmp_path, str(junk)))
    assert err.value.failure is Failure.CORRUPT_MODEL
    assert "neither a folder nor a tar archive of one" in err.value.message


def test_without_trtllm_build_the_job_says_which_image_it_needs(cli: Cli, tmp_path: Path) -> None:
    """The Job's CLI, as a subprocess: no trtllm-build on PATH is BuildFailed with the fix, in the termination log
    (caught: a missing tool that surfaced as an InternalError traceback would tell the user nothing)."""
    cli.fake_nvidia_smi("NVIDIA L4, 8.9")
    ck = checkpoint(tmp_path / "ckpt")
    done = cli.run(
        "build-llm", "--checkpoint-uri", str(ck), "--model-name", "llama", "--gpu-product", "NVIDIA-L4",
        "--store", str(tmp_path / "store"), "--max-num-tokens", "4096", "--no-timing",
    )  # fmt: skip
    assert done.code == Failure.BUILD_FAILED.exit_code, done.stderr
    assert done.termination_log.startswith("BuildFailed: trtllm-build is not installed in this image"), done.stderr
    assert "pip install tensorrt_llm" in done.termination_log


def test_the_job_cli_builds_and_reports_with_the_fake(cli: Cli, tmp_path: Path) -> None:
    """The whole Job entrypoint: flags → build → the report the operator reads (cacheKey, location, versions)."""
    cli.fake_nvidia_smi("NVIDIA L4, 8.9")
    (cli.bin_dir / "trtllm-build").write_text(FAKE_TRTLLM_BUILD.format(python=sys.executable))
    (cli.bin_dir / "trtllm-build").chmod(0o755)
    dist = tmp_path / "site" / "tensorrt_llm-0.16.0.dist-info"  # FAKE package metadata: the version only
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: 0.16.0\n")
    cli.extra_env.update(
        FAKE_TRTLLM_CALLS=str(tmp_path / "calls.jsonl"),
        PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), *sys.path]),
    )
    ck = checkpoint(tmp_path / "ckpt")
    done = cli.run(
        "build-llm", "--checkpoint-uri", str(ck), "--model-name", "llama", "--gpu-product", "NVIDIA-L4",
        "--store", str(tmp_path / "store"), "--cache-key", "eng-0123456789abcdef", "--max-batch-size", "64",
        "--max-num-tokens", "4096", "--max-input-len", "2048", "--max-seq-len", "4096", "--dtype", "float16",
    )  # fmt: skip
    assert done.code == 0, done.stderr
    report = json.loads(done.termination_log)
    assert report["reason"] == "EngineReady" and report["cacheKey"] == "eng-0123456789abcdef"
    assert report["location"] == "llama/1/engine" and report["gpuProduct"] == "NVIDIA-L4"
    assert report["modelDigest"] == f"sha256:{trtllm.tree_sha256(ck)}"
    [argv] = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert argv[argv.index("--max_input_len") + 1] == "2048"
    assert (tmp_path / "store" / "eng-0123456789abcdef" / "llama" / "1" / "engine" / "rank0.engine").is_file()

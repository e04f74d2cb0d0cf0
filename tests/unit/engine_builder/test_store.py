"""The engine store's publishing rules, and the termination message's size limit."""

from __future__ import annotations

import json
from pathlib import Path

from tailtune.engine_builder import store
from tailtune.engine_builder.cli import format_termination_message
from tailtune.engine_builder.errors import BuildError, Failure


def _publish(root: Path, key: str, content: bytes, marker: str) -> Path:
    return store.publish(
        root,
        key,
        model_name="m",
        backend="tensorrt",
        write_artifact=lambda path: path.write_bytes(content),
        metadata={"cacheKey": key, "marker": marker},
    )


def test_publish_lays_out_a_model_repository(tmp_path: Path) -> None:
    entry = _publish(tmp_path, "eng-1", b"plan", "first")
    assert entry == tmp_path / "eng-1"
    assert (entry / "m/1/model.plan").read_bytes() == b"plan"
    assert store.read_metadata(tmp_path, "eng-1") == {"cacheKey": "eng-1", "marker": "first"}
    assert [p.name for p in tmp_path.iterdir()] == ["eng-1"], "staging folders must not stay behind"
    assert entry.stat().st_mode & 0o777 == 0o755


def test_an_entry_published_first_wins(tmp_path: Path) -> None:
    _publish(tmp_path, "eng-1", b"first", "first")
    _publish(tmp_path, "eng-1", b"second", "second")
    assert (tmp_path / "eng-1/m/1/model.plan").read_bytes() == b"first"
    assert store.read_metadata(tmp_path, "eng-1") == {"cacheKey": "eng-1", "marker": "first"}


def test_a_folder_without_metadata_is_no_entry_and_is_replaced(tmp_path: Path) -> None:
    (tmp_path / "eng-1/m/1").mkdir(parents=True)
    (tmp_path / "eng-1/m/1/model.plan").write_bytes(b"half written")
    assert store.read_metadata(tmp_path, "eng-1") is None
    _publish(tmp_path, "eng-1", b"whole", "new")
    assert (tmp_path / "eng-1/m/1/model.plan").read_bytes() == b"whole"


def test_unreadable_metadata_is_no_hit(tmp_path: Path) -> None:
    (tmp_path / "eng-1").mkdir()
    (tmp_path / "eng-1" / store.METADATA_FILE).write_text("{not json")
    assert store.read_metadata(tmp_path, "eng-1") is None
    (tmp_path / "eng-1" / store.METADATA_FILE).write_text(json.dumps(["a list"]))
    assert store.read_metadata(tmp_path, "eng-1") is None


def test_timing_cache_path_is_per_tensorrt_and_product(tmp_path: Path) -> None:
    path = store.timing_cache_path(tmp_path, "10.13.0.35", "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb")
    assert path == tmp_path / "timing-caches/tensorrt-10.13.0.35-NVIDIA-A100-SXM4-80GB-MIG-1g.10gb.cache"


def test_termination_message_keeps_details_that_fit() -> None:
    error = BuildError(Failure.UNSUPPORTED_OP, "parser refused 3 nodes", details=["a" * 10, "b" * 10, "c" * 10])
    assert (
        format_termination_message(error)
        == "UnsupportedOp: parser refused 3 nodes\n" + "a" * 10 + "\n" + "b" * 10 + "\n" + "c" * 10
    )
    assert (
        format_termination_message(error, limit=60)
        == "UnsupportedOp: parser refused 3 nodes\n" + "a" * 10 + "\n" + "b" * 10
    )
    long = BuildError(Failure.CORRUPT_MODEL, "x" * 5000)
    message = format_termination_message(long)
    assert len(message.encode()) == 4096 and message.endswith("...")

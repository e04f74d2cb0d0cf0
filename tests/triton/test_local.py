"""Starting the real local tritonserver when ports are contended: tests that start servers side by side
(the canary fleet starts three at once) must not lose a start to a port picked twice."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from devkit import ports as ports_module
from devkit.ports import free_ports
from devkit.triton import local
from devkit.triton.local import TritonNotFound, TritonStartError, find_triton, start_tritonserver


@pytest.fixture
def empty_repo(tmp_path: Path) -> Path:
    try:
        find_triton()
    except TritonNotFound as e:
        pytest.skip(str(e))
    repo = tmp_path / "repo"
    repo.mkdir()
    return repo


@pytest.fixture
def occupied() -> Iterator[int]:
    """A port another party is listening on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_ports_picked_by_concurrent_threads_are_all_distinct() -> None:
    with ThreadPoolExecutor(8) as pool:
        picks = list(pool.map(lambda _: free_ports(3), range(64)))
    ports = [p for pick in picks for p in pick]
    assert len(ports) == 64 * 3
    assert len(set(ports)) == len(ports), "a port was handed out twice"


def test_a_port_taken_after_the_pick_is_picked_again(
    empty_repo: Path, occupied: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ports_module.free_ports
    calls: list[list[int]] = []

    def first_pick_collides(count: int, host: str = "127.0.0.1") -> list[int]:
        ports = real(count, host)
        if not calls:
            ports[0] = occupied  # the HTTP port: someone bound it between the pick and the server's bind
        calls.append(ports)
        return ports

    monkeypatch.setattr(local, "free_ports", first_pick_collides)
    with start_tritonserver(empty_repo, exit_timeout_secs=1) as server:
        assert server.running()
        assert server.http_port != occupied
        assert [server.http_port, server.grpc_port, server.metrics_port] == calls[-1]
    assert len(calls) == 2, calls


def test_ports_the_caller_fixed_are_not_replaced_and_the_reason_comes_first(empty_repo: Path, occupied: int) -> None:
    with pytest.raises(TritonStartError) as err:
        start_tritonserver(empty_repo, http_port=occupied, exit_timeout_secs=1, ready_timeout=30)
    head = str(err.value).splitlines()[:3]
    assert any(f"127.0.0.1:{occupied}" in line and "already in use" in line for line in head), head

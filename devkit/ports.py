"""Free TCP ports for the harness and the tests: distinct within a call and never handed out twice by one
process, so servers started side by side (threads of one test, a fleet) cannot be given the same port."""

from __future__ import annotations

import re
import socket
import threading

# What a server prints when a port picked for it was bound by another process between the pick and its own bind
# (Go's and glibc's wording: "bind: address already in use", "Address already in use").
PORT_TAKEN = re.compile(r"[Aa]ddress already in use")

_PORTS_LOCK = threading.Lock()
_HANDED_OUT: set[tuple[str, int]] = set()


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct TCP ports free on `host` right now, none handed out before by this process.

    The sockets stay bound until all are picked, so the kernel cannot hand the same port out twice in one
    call; the process-wide record keeps threads that start servers concurrently from sharing a port. The
    caller binds them soon after (a port can still be taken by another process meanwhile:
    `start_tritonserver` retries on that).
    """
    with _PORTS_LOCK:
        held: list[socket.socket] = []
        try:
            ports: list[int] = []
            for _ in range(count + 256):
                if len(ports) == count:
                    break
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(s)
                s.bind((host, 0))
                port = int(s.getsockname()[1])
                if (host, port) not in _HANDED_OUT:
                    ports.append(port)
            if len(ports) < count:
                raise OSError(f"could not find {count} free ports on {host} not handed out before")
            _HANDED_OUT.update((host, p) for p in ports)
            return ports
        finally:
            for s in held:
                s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the caller binds it soon after; good enough for tests)."""
    return free_ports(1, host)[0]

"""`tailtune operator` with every request it sends to the API server counted, for tests/e2e/test_fleet_reads.py.

Run as `python tests/e2e/probes/counting_operator.py COUNTS_FILE [operator args...]`. Both of the operator's clients
are counted where they send: the Kubernetes client (urllib3) and kopf (aiohttp, its watches included). Every second
the counts go to COUNTS_FILE as JSON, keyed "verb resource" (verb: get, list, watch, create, patch, delete...).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter
from typing import Any
from urllib.parse import parse_qs, urlsplit

COUNTS: Counter[str] = Counter()
_LOCK = threading.Lock()
# Path segments after a namespace or the cluster scope: resource, name, subresource.
_SCOPED = ("namespaces",)
API_SERVER = ""


def request_key(method: str, url: str) -> str:
    """'verb resource' of one API request: a GET with an object's name is a get, without one a list (a watch when
    the query says so); /status and other subresources are named after their resource."""
    parts = urlsplit(str(url))
    segments = [s for s in parts.path.split("/") if s]
    if not segments or segments[0] not in ("api", "apis"):
        return f"{method.lower()} {parts.path}"
    rest = segments[2:] if segments[0] == "api" else segments[3:]  # after /api/v1 or /apis/group/version
    if len(rest) >= 2 and rest[0] in _SCOPED and len(rest) > 2:
        rest = rest[2:]  # namespaces/<ns>/<resource>...
    resource = "/".join([rest[0], *rest[2:]]) if rest else "(root)"
    verb = method.lower()
    if verb == "get":
        query = parse_qs(parts.query)
        verb = "watch" if query.get("watch", [""])[0] in ("true", "1") else ("get" if len(rest) >= 2 else "list")
    return f"{verb} {resource}"


def _api_server() -> str:
    """host:port of the API server in $KUBECONFIG's current context: only requests there are counted (Prometheus
    is read through the same urllib3)."""
    import yaml

    with open(os.environ["KUBECONFIG"]) as f:
        kubeconfig = yaml.safe_load(f)
    context = next(c["context"] for c in kubeconfig["contexts"] if c["name"] == kubeconfig["current-context"])
    server = next(c["cluster"]["server"] for c in kubeconfig["clusters"] if c["name"] == context["cluster"])
    return urlsplit(server).netloc


def _count(method: str, url: Any, netloc: str) -> None:
    if netloc != API_SERVER:
        return
    with _LOCK:
        COUNTS[request_key(method, str(url))] += 1


def _install() -> None:
    import aiohttp
    import urllib3.connectionpool

    sync_urlopen = urllib3.connectionpool.HTTPConnectionPool.urlopen

    def urlopen(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        _count(method, url, f"{self.host}:{self.port}")
        return sync_urlopen(self, method, url, *args, **kwargs)

    urllib3.connectionpool.HTTPConnectionPool.urlopen = urlopen  # type: ignore[method-assign]

    async_request = aiohttp.ClientSession._request

    async def request(self: Any, method: str, str_or_url: Any, *args: Any, **kwargs: Any) -> Any:
        params = kwargs.get("params")
        url = str(str_or_url)
        if params and "watch" in dict(params):
            url += ("&" if "?" in url else "?") + "watch=true"
        _count(method, url, urlsplit(url).netloc)
        return await async_request(self, method, str_or_url, *args, **kwargs)

    aiohttp.ClientSession._request = request  # type: ignore[method-assign]


def _dump_every_second(path: str) -> None:
    while True:
        with _LOCK:
            data = json.dumps(dict(COUNTS), sort_keys=True)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(data)
        os.replace(tmp, path)
        time.sleep(1.0)


def main() -> int:
    global API_SERVER
    path, args = sys.argv[1], sys.argv[2:]
    API_SERVER = _api_server()
    _install()
    threading.Thread(target=_dump_every_second, args=(path,), daemon=True).start()
    from tailtune.cli import main as tailtune_main

    return tailtune_main(["operator", *args])


if __name__ == "__main__":
    sys.exit(main())

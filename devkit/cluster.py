"""The local cluster: a Kubernetes control plane for tailtune's tests and demo, as plain processes on 127.0.0.1.

etcd, kube-apiserver (RBAC on), kube-controller-manager, kube-scheduler and kwok, which plays the kubelet
of the fake GPU nodes in the checkout's hack/cluster/nodes.yaml with the stages in hack/cluster/kwok/.
Binaries come from hack/cluster/build.sh (cached). No Docker.

    python -m devkit.cluster up       # start (idempotent); prints `export KUBECONFIG=... PATH=...`
    python -m devkit.cluster env      # print the exports of a running cluster
    python -m devkit.cluster status   # exit 0 when every component is up
    python -m devkit.cluster down     # stop the processes `up` recorded and delete the state dir

(`python hack/cluster/cluster.py ...` is the same command.)

Environment: TAILTUNE_CLUSTER_DIR (state dir, default <checkout>/.cache/cluster), TAILTUNE_CLUSTER_BIN (use
these binaries instead of running build.sh), TAILTUNE_CLUSTER_<NAME>_PORT for NAME in ETCD, ETCD_PEER,
APISERVER, CONTROLLER_MANAGER, SCHEDULER, KWOK (default: free ports).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import functools
import json
import os
import secrets
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from devkit.checkout import Checkout, CheckoutNotFound, find_checkout
from devkit.ports import PORT_TAKEN, free_ports
from devkit.procs import Process, Recorded, terminate

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_API_IP = "10.96.0.1"  # first address of SERVICE_CIDR: the `kubernetes` Service
POD_CIDR = "10.244.0.0/16"  # kwok's pool of pod IPs; its default /24 runs out at 254 pods
KWOK_STAGES = (
    "node-initialize.yaml",
    "node-heartbeat-with-lease.yaml",
    "pod-ready.yaml",
    "pod-complete.yaml",
    "pod-fail.yaml",
    "pod-delete.yaml",
)
# Start order; `down` stops them in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


def log(message: str) -> None:
    print(f"[cluster] {message}", file=sys.stderr, flush=True)


class LocalClusterError(RuntimeError):
    """The local cluster could not be started, or is not running."""


@dataclass(frozen=True)
class Ports:
    etcd: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int


# Starts tried when another process takes a port picked for a component (as `start_tritonserver` does).
START_ATTEMPTS = 3


@dataclass(frozen=True)
class LocalCluster:
    """A local cluster as `up` records it in <state dir>/cluster.json for `env`, `status`, `down` and the
    test fixtures: its binaries, admin kubeconfig, API server URL and ports."""

    bin_dir: str
    kubeconfig: str
    server: str
    ports: Ports

    @staticmethod
    def load(path: Path) -> LocalCluster:
        raw = json.loads(path.read_text())
        return LocalCluster(raw["bin_dir"], raw["kubeconfig"], raw["server"], Ports(**raw["ports"]))


class Layout:
    """Paths inside the state dir."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pki = root / "pki"
        self.logs = root / "logs"
        self.pids = root / "pids"
        self.etcd_data = root / "etcd"
        self.state = root / "cluster.json"
        self.kubeconfig = root / "kubeconfig"

    def component_kubeconfig(self, name: str) -> Path:
        return self.root / f"{name}.kubeconfig"

    def pid_file(self, name: str) -> Path:
        return self.pids / f"{name}.json"

    def log_file(self, name: str) -> Path:
        return self.logs / f"{name}.log"


@functools.cache
def checkout() -> Checkout:
    """The checkout whose hack/cluster this module builds and starts from."""
    return find_checkout()


def state_dir() -> Path:
    """TAILTUNE_CLUSTER_DIR, else <checkout>/.cache/cluster."""
    given = os.environ.get("TAILTUNE_CLUSTER_DIR")
    return Path(given).resolve() if given else checkout().cache / "cluster"


# ---------------------------------------------------------------------------------------------- build


def build() -> Path:
    """Runs build.sh (a no-op when its cache is warm) and returns the bin dir; TAILTUNE_CLUSTER_BIN wins."""
    given = os.environ.get("TAILTUNE_CLUSTER_BIN")
    if given:
        return Path(given).resolve()
    result = subprocess.run(
        ["bash", str(checkout().cluster_dir / "build.sh")],
        stdout=subprocess.PIPE,
        stderr=sys.stderr,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise LocalClusterError(f"hack/cluster/build.sh failed with exit code {result.returncode}")
    return Path(result.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------- pki

_OPENSSL_CNF = """\
[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign,digitalSignature
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = @alt_names
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
[alt_names]
DNS.1 = localhost
DNS.2 = kubernetes
DNS.3 = kubernetes.default
DNS.4 = kubernetes.default.svc
DNS.5 = kubernetes.default.svc.cluster.local
IP.1 = 127.0.0.1
IP.2 = {service_api_ip}
"""
_EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]  # fast to generate
# Client identities: admin is cluster-admin through its group; the others get the bootstrap RBAC roles.
CLIENTS = {
    "admin": "/O=system:masters/CN=tailtune-admin",
    "kube-controller-manager": "/CN=system:kube-controller-manager",
    "kube-scheduler": "/CN=system:kube-scheduler",
}


def openssl(*args: str | Path) -> None:
    result = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise LocalClusterError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def make_pki(pki: Path) -> None:
    """A CA with the apiserver's serving cert and the CLIENTS certs; a front-proxy CA and client (the
    aggregation layer, which the controller-manager and scheduler read at start); the service-account keys."""
    if shutil.which("openssl") is None:
        raise LocalClusterError("openssl not found (apt-get install openssl)")
    pki.mkdir(parents=True, exist_ok=True)
    cnf = pki / "openssl.cnf"
    cnf.write_text(_OPENSSL_CNF.format(service_api_ip=SERVICE_API_IP))

    # fmt: off
    def authority(name: str) -> None:
        openssl("req", "-x509", "-new", "-config", cnf, "-extensions", "ca", *_EC_KEY, "-days", "3650",
                "-keyout", pki / f"{name}.key", "-out", pki / f"{name}.crt", "-subj", f"/CN=tailtune-{name}")

    def leaf(name: str, subject: str, extensions: str, ca: str = "ca") -> None:
        key, csr, crt = (pki / f"{name}.{suffix}" for suffix in ("key", "csr", "crt"))
        openssl("req", "-new", "-config", cnf, *_EC_KEY, "-keyout", key, "-out", csr, "-subj", subject)
        openssl("x509", "-req", "-in", csr, "-CA", pki / f"{ca}.crt", "-CAkey", pki / f"{ca}.key",
                "-days", "3650", "-set_serial", hex(secrets.randbits(63) | 1),
                "-extfile", cnf, "-extensions", extensions, "-out", crt)
        csr.unlink()
    # fmt: on

    authority("ca")
    leaf("apiserver", "/CN=kube-apiserver", "server")
    for name, subject in CLIENTS.items():
        leaf(name, subject, "client")
    authority("front-proxy-ca")
    leaf("front-proxy-client", "/CN=front-proxy-client", "client", ca="front-proxy-ca")
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", pki / "sa.key")
    openssl("pkey", "-in", pki / "sa.key", "-pubout", "-out", pki / "sa.pub")


def write_kubeconfig(path: Path, server: str, pki: Path, client: str) -> None:
    """A self-contained kubeconfig (certs embedded); JSON is valid YAML for every client."""

    def b64(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "tailtune", "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")}}],
        "users": [
            {
                "name": client,
                "user": {
                    "client-certificate-data": b64(f"{client}.crt"),
                    "client-key-data": b64(f"{client}.key"),
                },
            }
        ],
        "contexts": [{"name": "tailtune", "context": {"cluster": "tailtune", "user": client, "namespace": "default"}}],
        "current-context": "tailtune",
        "preferences": {},
    }
    path.write_text(json.dumps(config, indent=2) + "\n")
    path.chmod(0o600)


# --------------------------------------------------------------------------------------------- ports


def given_ports() -> dict[str, int]:
    """The ports set by TAILTUNE_CLUSTER_<NAME>_PORT."""
    names = (field.name for field in fields(Ports))
    return {n: int(v) for n in names if (v := os.environ.get(f"TAILTUNE_CLUSTER_{n.upper()}_PORT"))}


def pick_ports() -> Ports:
    """Ports from TAILTUNE_CLUSTER_<NAME>_PORT, else free ones (`ports.free_ports`: distinct, never handed out
    twice by this process)."""
    chosen = given_ports()
    free = iter(free_ports(len(fields(Ports)) - len(chosen)))
    return Ports(**{f.name: chosen[f.name] if f.name in chosen else next(free) for f in fields(Ports)})


# ----------------------------------------------------------------------------------------- processes


def command_lines(layout: Layout, bin_dir: Path, ports: Ports) -> dict[str, list[str]]:
    """Every component's command line, in start order."""
    pki = layout.pki
    etcd_url, peer_url = f"http://127.0.0.1:{ports.etcd}", f"http://127.0.0.1:{ports.etcd_peer}"

    def delegating(name: str, port: int) -> list[str]:
        # Serving flags for the controller-manager and scheduler: own port, health open to anyone.
        kubeconfig = str(layout.component_kubeconfig(name))
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--leader-elect=false",
        ]

    return {
        "etcd": [
            str(bin_dir / "etcd"),
            "--name=tailtune",
            f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=tailtune={peer_url}",
            "--unsafe-no-fsync=true",
            "--auto-compaction-retention=1",
            "--quota-backend-bytes=4294967296",
            "--log-level=warn",
        ],
        "kube-apiserver": [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={ports.apiserver}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=Node,RBAC",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
            # Loopback may not be an Endpoints address; nothing here needs the `kubernetes` endpoints.
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--profiling=false",
        ],
        "kube-controller-manager": [
            str(bin_dir / "kube-controller-manager"),
            *delegating("kube-controller-manager", ports.controller_manager),
            "--controllers=*",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--kube-api-qps=100",
            "--kube-api-burst=200",
            "--profiling=false",
        ],
        "kube-scheduler": [
            str(bin_dir / "kube-scheduler"),
            *delegating("kube-scheduler", ports.scheduler),
            "--profiling=false",
        ],
        "kwok": [
            str(bin_dir / "kwok"),
            f"--kubeconfig={layout.kubeconfig}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--cidr={POD_CIDR}",
            # kwok renews node leases like a kubelet only when given a duration (unset: no leases, and the
            # node-lifecycle controller marks the nodes NotReady after its grace period).
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{ports.kwok}",
            *(f"--config={checkout().cluster_dir / 'kwok' / stage}" for stage in KWOK_STAGES),
        ],
    }


def start(layout: Layout, name: str, argv: list[str]) -> Process:
    """Starts one component in its own session (it outlives `up`), logging to logs/<name>.log, recorded as
    pids/<name>.json."""
    return Process.start(
        argv, log_path=layout.log_file(name), cwd=layout.root, pid_dir=layout.pids, record_as=name, name=name,
        die_with_parent=False,
    )  # fmt: skip


def recorded(layout: Layout) -> dict[str, Recorded]:
    """The components `up` recorded, by name."""
    found = {}
    for name in COMPONENTS:
        proc = Recorded.load(layout.pid_file(name))
        if proc is not None:
            found[name] = proc
    return found


def stop(name: str, proc: Recorded, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after grace_s; only if the pid still runs the binary we started."""
    if terminate([proc], grace_s):
        log(f"{name} (pid {proc.pid}) ignored SIGTERM; killed it")


def log_tail(layout: Layout, name: str, lines: int = 40) -> str:
    try:
        text = layout.log_file(name).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# ----------------------------------------------------------------------------------------- API access


class Api:
    """Minimal HTTPS client for the apiserver and the components' health endpoints, as the admin."""

    def __init__(self, layout: Layout, server: str) -> None:
        self.server = server
        self.context = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
        self.context.load_cert_chain(str(layout.pki / "admin.crt"), str(layout.pki / "admin.key"))
        # The controller-manager and scheduler serve with self-signed certs made at start-up.
        self.insecure = ssl.create_default_context()
        self.insecure.check_hostname = False
        self.insecure.verify_mode = ssl.CERT_NONE

    def get(self, path: str) -> Any:
        """GET server+path as JSON; None on 404."""
        try:
            with urllib.request.urlopen(self.server + path, context=self.context, timeout=5) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise

    def healthy(self, url: str) -> bool:
        """True when url answers 200."""
        context = None
        if url.startswith("https:"):
            context = self.context if url.startswith(self.server) else self.insecure
        try:
            with urllib.request.urlopen(url, context=context, timeout=2) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False


def wait_until(
    what: str,
    check: Callable[[], bool],
    timeout_s: float,
    watched: dict[str, Process],
    layout: Layout,
) -> None:
    """Polls check() until true; fails early, with the log, if a watched process exits."""
    deadline = time.monotonic() + timeout_s
    while True:
        for name, proc in watched.items():
            if proc.poll() is not None:
                raise LocalClusterError(
                    f"{name} exited with {proc.returncode} while waiting for {what}:\n" + log_tail(layout, name)
                )
        with contextlib.suppress(OSError, ValueError, KeyError):
            if check():
                return
        if time.monotonic() > deadline:
            raise LocalClusterError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.2)


def nodes_ready(api: Api, names: list[str]) -> bool:
    """Every node is Ready and free of the not-ready taint the scheduler honours."""
    for name in names:
        node = api.get(f"/api/v1/nodes/{name}")
        if node is None:
            return False
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))
        tainted = any(t["key"].startswith("node.kubernetes.io/") for t in node["spec"].get("taints", []))
        if not ready or tainted:
            return False
    return True


def node_names() -> list[str]:
    import yaml  # PyYAML: only needed here, after the control plane is up

    return [
        doc["metadata"]["name"]
        for doc in yaml.safe_load_all((checkout().cluster_dir / "nodes.yaml").read_text())
        if doc
    ]


def kubectl(state: LocalCluster, *args: str) -> str:
    result = subprocess.run(
        [str(Path(state.bin_dir) / "kubectl"), f"--kubeconfig={state.kubeconfig}", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise LocalClusterError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


# ------------------------------------------------------------------------------------------ commands


def running_state(layout: Layout, patience_s: float = 30) -> LocalCluster | None:
    """The recorded state if every component runs and the apiserver gets ready within patience_s, else None.

    The patience keeps a busy cluster from being taken for a stale one and restarted under its users."""
    if not layout.state.exists():
        return None
    state = LocalCluster.load(layout.state)
    procs = recorded(layout)
    if set(procs) != set(COMPONENTS):
        return None
    api = Api(layout, state.server)
    deadline = time.monotonic() + patience_s
    while all(p.alive() for p in procs.values()):
        if api.healthy(state.server + "/readyz"):
            return state
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return None


def exports(state: LocalCluster) -> str:
    return f"export KUBECONFIG={state.kubeconfig} PATH={state.bin_dir}:$PATH"


@contextlib.contextmanager
def timed(what: str, timings: dict[str, float]) -> Iterator[None]:
    started = time.monotonic()
    yield
    timings[what] = time.monotonic() - started
    log(f"{what}: {timings[what]:.1f} s")


def up() -> LocalCluster:
    """Starts the cluster unless it already runs; returns its state."""
    layout = Layout(state_dir())
    existing = running_state(layout)
    if existing is not None:
        log(f"already up at {existing.server} (state in {layout.root})")
        return existing
    if layout.root.exists():
        log(f"cleaning up a stale cluster in {layout.root}")
        down()

    timings: dict[str, float] = {}
    with timed("build", timings):
        bin_dir = build()
    missing = [name for name in (*COMPONENTS, "kubectl") if not (bin_dir / name).is_file()]
    if missing:
        raise LocalClusterError(f"missing binaries in {bin_dir}: {', '.join(missing)}")

    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            return _start(layout, bin_dir, pick_ports(), timings)
        except LocalClusterError as e:
            # Another process bound a port picked here before its component did (free ports are picked a few
            # seconds ahead): pick again, unless every port was given (then the error is the caller's to see).
            if attempt == START_ATTEMPTS or len(given_ports()) == len(fields(Ports)) or not PORT_TAKEN.search(str(e)):
                raise
            log(f"a port picked for the cluster was taken before its component bound it: picking again ({e})")
    raise AssertionError("unreachable: the last attempt raises")


def _start(layout: Layout, bin_dir: Path, ports: Ports, timings: dict[str, float]) -> LocalCluster:
    """One start of every component on `ports`, from an empty etcd; what was started is stopped if one fails."""
    started = time.monotonic()
    shutil.rmtree(layout.etcd_data, ignore_errors=True)  # an attempt before this one's, on other ports
    for path in (layout.root, layout.logs, layout.pids, layout.etcd_data):
        path.mkdir(parents=True, exist_ok=True)
    layout.etcd_data.chmod(0o700)
    commands = command_lines(layout, bin_dir, ports)
    server = f"https://127.0.0.1:{ports.apiserver}"
    state = LocalCluster(str(bin_dir), str(layout.kubeconfig), server, ports)
    try:
        with timed("certificates", timings):
            make_pki(layout.pki)
            write_kubeconfig(layout.kubeconfig, server, layout.pki, "admin")
            for name in ("kube-controller-manager", "kube-scheduler"):
                write_kubeconfig(layout.component_kubeconfig(name), server, layout.pki, name)
        layout.state.write_text(json.dumps(asdict(state), indent=2) + "\n")
        api = Api(layout, server)
        procs: dict[str, Process] = {}

        with timed("etcd", timings):
            procs["etcd"] = start(layout, "etcd", commands["etcd"])
            wait_until(
                "etcd /health",
                lambda: api.healthy(f"http://127.0.0.1:{ports.etcd}/health"),
                60,
                procs,
                layout,
            )
        with timed("kube-apiserver", timings):
            procs["kube-apiserver"] = start(layout, "kube-apiserver", commands["kube-apiserver"])
            wait_until("kube-apiserver /readyz", lambda: api.healthy(server + "/readyz"), 180, procs, layout)
        with timed("controllers", timings):
            for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
                procs[name] = start(layout, name, commands[name])
            health = {
                "kube-controller-manager": f"https://127.0.0.1:{ports.controller_manager}/healthz",
                "kube-scheduler": f"https://127.0.0.1:{ports.scheduler}/healthz",
                "kwok": f"http://127.0.0.1:{ports.kwok}/healthz",
            }
            for name, url in health.items():
                wait_until(f"{name} {url}", functools.partial(api.healthy, url), 120, procs, layout)
            wait_until(
                "the default ServiceAccount",
                lambda: api.get("/api/v1/namespaces/default/serviceaccounts/default") is not None,
                120,
                procs,
                layout,
            )
        with timed("nodes", timings):
            kubectl(state, "apply", "-f", str(checkout().cluster_dir / "nodes.yaml"))
            names = node_names()
            wait_until(
                f"nodes {', '.join(names)} Ready and untainted",
                lambda: nodes_ready(api, names),
                120,
                procs,
                layout,
            )
    except BaseException:
        log(f"start-up failed; logs are in {layout.logs}; stopping what was started")
        stop_all(layout)
        raise
    log(f"up in {time.monotonic() - started:.1f} s (build {timings['build']:.1f} s): {server}, state in {layout.root}")
    return state


def stop_all(layout: Layout) -> None:
    procs = recorded(layout)
    for name in reversed(COMPONENTS):
        if name in procs:
            stop(name, procs[name])
            layout.pid_file(name).unlink(missing_ok=True)


def down() -> None:
    """Stops the recorded processes and deletes the state dir."""
    layout = Layout(state_dir())
    if not layout.root.exists():
        log(f"nothing to do: {layout.root} does not exist")
        return
    started = time.monotonic()
    stop_all(layout)
    shutil.rmtree(layout.root)
    log(f"down in {time.monotonic() - started:.1f} s; removed {layout.root}")


def status() -> bool:
    layout = Layout(state_dir())
    if not layout.state.exists():
        print(f"down (no {layout.state})")
        return False
    state = LocalCluster.load(layout.state)
    procs = recorded(layout)
    ok = True
    for name in COMPONENTS:
        proc = procs.get(name)
        alive = proc is not None and proc.alive()
        ok &= alive
        print(f"{name:24} {'running' if alive else 'NOT RUNNING'}" + (f" pid {proc.pid}" if proc else ""))
    api = Api(layout, state.server)
    ready = api.healthy(state.server + "/readyz")
    ok &= ready
    print(f"{'apiserver /readyz':24} {'ok' if ready else 'NOT READY'} {state.server}")
    if ready:
        names = node_names()
        nodes_ok = nodes_ready(api, names)
        ok &= nodes_ok
        print(f"{'nodes':24} {'ready' if nodes_ok else 'NOT READY'} {', '.join(names)}")
    print(f"{'kubeconfig':24} {state.kubeconfig}")
    return ok


@contextlib.contextmanager
def exclusive() -> Iterator[None]:
    """Serialises `up` and `down` on one state dir (say, pytest and a developer's shell)."""
    root = state_dir()
    root.parent.mkdir(parents=True, exist_ok=True)
    with (root.parent / f".{root.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["up", "down", "env", "status"])
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            with exclusive():
                state = up()
            print(exports(state))
        elif args.command == "down":
            with exclusive():
                down()
        elif args.command == "env":
            layout = Layout(state_dir())
            if not layout.state.exists():
                raise LocalClusterError(f"not up: no {layout.state}")
            print(exports(LocalCluster.load(layout.state)))
        else:
            return 0 if status() else 1
    except (LocalClusterError, CheckoutNotFound) as error:
        log(f"error: {error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

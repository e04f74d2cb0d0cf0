"""A process runtime ("kubelet") for the local cluster: pods on its nodes run as local processes.

    python -m devkit.runtime --kubeconfig K --workdir W [--node demo-l4-0 --node demo-l4-1]

It registers its own nodes (fake GPUs, no kwok annotation, so kwok leaves them alone), keeps them Ready
(a Lease renewed in kube-node-lease, node status heartbeats), watches the pods bound to them and runs:

- an engine-build Job's pod (`python -m tailtune.engine_builder ...`) for real, with its volumes mapped to
  local folders (a PVC is its PV's hostPath) and `/dev/termination-log` to a file whose content becomes the
  container's terminated message; the pod ends Succeeded or Failed with the builder's exit code;
- a Triton pod as a real `tritonserver` bound to the pod's IP (127.0.1.N, loopback: nothing leaves this
  machine), on a repository built from the pod's ConfigMap with the model swapped for the EMULATED
  accelerator (`devkit.emulation`), or, for a pod with `emulated-llm.dev.tailtune.io/*` annotations (a generative
  service), for the EMULATED inflight-batching LLM (`devkit.llm.pod`); the pod is Ready when its readiness probe
  (`/v2/models/<m>/ready`) answers 200, so warmup gates readiness for real. Ports 8000 (HTTP) and 8001
  (gRPC) are the emulation shim (`devkit.shim`) in front of Triton's 18000/18001; 8002 (metrics)
  is Triton's own. A test arms reload faults for a pod under `<workdir>/faults/` (`devkit.faults`).

Deleting a pod stops its processes (SIGTERM, SIGKILL after the grace period), frees its IP and removes the
pod, as a kubelet does. Children die with the runtime (PR_SET_PDEATHSIG). Development use only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from devkit.emulation import (
    ANNOTATION_PREFIX,
    EmulationError,
    curve_from_annotations,
    emulate_pbtxt,
    emulation_parameters,
)
from devkit.kubeclient import ApiError, KubeClient
from devkit.llm.pod import LlmPodError, is_llm_pod, llm_from_annotations, warmup_requests
from devkit.llm.repository import is_trtllm_config, parse_pbtxt, with_trtllm_settings, write_llm_repository
from devkit.pods import (
    ContainerView,
    Manifest,
    Mounts,
    NodeSpec,
    PodView,
    build_lease,
    build_node,
    flag_value,
    node_status,
    pod_status,
    pre_stop_seconds,
    without_flags,
)
from devkit.procs import Process
from devkit.shim import Shim
from devkit.triton.local import find_triton, prepare_backend_dir, server_command, venv_site_packages
from tailtune.engine_builder.ladder import ladder

log = logging.getLogger("devkit.runtime")

IP_PREFIX = "127.0.1."
FAULTS_DIR = "faults"  # under the workdir: reload faults a test arms per pod IP (devkit.faults)
IP_FIRST, IP_LAST = 2, 254
# Triton's real HTTP and gRPC ports behind the shim, on the pod's own IP.
UPSTREAM_HTTP_PORT, UPSTREAM_GRPC_PORT = 18000, 18001
TICK_S = 1.0
LEASE_RENEW_S = 10.0
NODE_STATUS_S = 30.0
PROBE_TIMEOUT_S = 1.0
TERMINATION_MESSAGE_LIMIT = 4096
RESTART_BACKOFF_S = (5.0, 10.0, 20.0, 40.0)
MAX_GRACE_S = 15.0


def utcnow() -> datetime:
    return datetime.now(UTC)


# ----------------------------------------------------------------------------------------- processes


def _tail(path: Path, limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode(errors="replace")


class IpPool:
    """Pod IPs in 127.0.1.0/24; an address is handed out only when the pod ports are free on it."""

    def __init__(self, ports: tuple[int, ...]) -> None:
        self.ports = ports
        self.taken: dict[str, str] = {}  # ip -> pod uid

    def _free(self, ip: str) -> bool:
        for port in self.ports:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((ip, port))
                except OSError:
                    return False
        return True

    def allocate(self, uid: str) -> str:
        for ip, owner in self.taken.items():
            if owner == uid:
                return ip
        for n in range(IP_FIRST, IP_LAST + 1):
            ip = f"{IP_PREFIX}{n}"
            if ip not in self.taken and self._free(ip):
                self.taken[ip] = uid
                return ip
        raise RuntimeError(f"no free pod IP in {IP_PREFIX}0/24")

    def release(self, ip: str | None, uid: str) -> bool:
        """Free `ip` if `uid` holds it; False when it was free or another pod's already."""
        if ip is not None and self.taken.get(ip) == uid:
            del self.taken[ip]
            return True
        return False


# ---------------------------------------------------------------------------------------------- pods


class PodError(Exception):
    """The pod cannot run here; the message ends up in the pod's status."""


def _container(pod: Manifest) -> Manifest:
    containers: list[Manifest] = pod["spec"].get("containers", [])
    if len(containers) != 1:
        raise PodError(f"the local runtime runs pods of exactly one container, not {len(containers)}")
    return containers[0]


def _argv(container: Manifest) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


def is_triton(pod: Manifest) -> bool:
    """A pod whose container runs `tritonserver`."""
    argv = _argv(_container(pod))
    return bool(argv) and os.path.basename(argv[0]) == "tritonserver"


def is_engine_build(pod: Manifest) -> bool:
    """A pod whose container runs `python -m tailtune.engine_builder`."""
    argv = _argv(_container(pod))
    return "-m" in argv and "tailtune.engine_builder" in argv


@dataclass
class LocalPod:
    """One pod's local life: its IP, folder, process and what its status says."""

    namespace: str
    name: str
    uid: str
    node: str
    kind: str  # "build" | "triton" | "unsupported"
    dir: Path
    start_time: datetime
    ip: str | None = None
    process: Process | None = None
    view: PodView | None = None
    ready: bool = False
    restarts: int = 0
    restart_at: float | None = None
    last_exit: tuple[int, str] | None = None
    probe_url: str | None = None
    termination_log: Path | None = None
    # A build for the emulated accelerator: the ladder it reports (batch, ms) instead of timing this CPU.
    emulated_ladder: tuple[tuple[int, float], ...] = ()
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    sent: Manifest | None = None
    stopping: threading.Thread | None = None
    stopped: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class Runtime:
    """Owns `nodes`; runs their pods. `run()` loops in the calling (main) thread until `stop` is set."""

    def __init__(self, kube: KubeClient, nodes: list[NodeSpec], workdir: Path) -> None:
        self.kube = kube
        self.nodes = nodes
        self.workdir = workdir
        self.pid_dir = workdir / "pids"
        self.pods_dir = workdir / "pods"
        self.pool = IpPool((8000, 8001, 8002, UPSTREAM_HTTP_PORT, UPSTREAM_GRPC_PORT))
        self.faults_dir = workdir / FAULTS_DIR
        self.shim = Shim(self.faults_dir)
        self.local: dict[str, LocalPod] = {}
        self.cache: dict[str, dict[str, Manifest]] = {n.name: {} for n in nodes}
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.node_uids: dict[str, str] = {}
        self.ready_since = utcnow()

    # ---- nodes ---------------------------------------------------------------------------------------
    def register_nodes(self) -> None:
        now = utcnow()
        for spec in self.nodes:
            self.node_uids[spec.name] = self.kube.register_node(build_node(spec, now))
        self.renew_leases()
        log.info("registered nodes %s", ", ".join(n.name for n in self.nodes))

    def renew_leases(self) -> None:
        now = utcnow()
        for spec in self.nodes:
            self.kube.renew_lease(build_lease(spec.name, self.node_uids.get(spec.name, ""), now))

    def report_node_status(self) -> None:
        now = utcnow()
        for spec in self.nodes:
            self.kube.patch_node_status(spec.name, node_status(spec, now, self.ready_since))

    # ---- informer --------------------------------------------------------------------------------------
    def _watch(self, node: str) -> None:
        """List, then watch, the pods of one node into `cache`; relist on any error."""
        while not self.stop.is_set():
            try:
                listed = self.kube.list_pods(node)
                with self.lock:
                    self.cache[node] = {p["metadata"]["uid"]: p for p in listed.get("items", [])}
                self.wake.set()
                rv = listed["metadata"]["resourceVersion"]
                while not self.stop.is_set():
                    for event in self.kube.watch_pods(node, rv, timeout_s=60):
                        kind, obj = event.get("type"), event.get("object", {})
                        if kind == "ERROR":
                            raise RuntimeError(f"watch error: {obj.get('message')}")
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if kind == "BOOKMARK":
                            continue
                        with self.lock:
                            if kind == "DELETED":
                                self.cache[node].pop(obj["metadata"]["uid"], None)
                            else:
                                self.cache[node][obj["metadata"]["uid"]] = obj
                        self.wake.set()
            except Exception as exc:  # the API server restarted, a watch expired (410): relist
                if not self.stop.is_set():
                    log.info("watch of %s ended (%s); relisting", node, exc)
                    time.sleep(1)

    # ---- the loop ------------------------------------------------------------------------------------
    def run(self) -> None:
        self.register_nodes()
        for spec in self.nodes:
            threading.Thread(target=self._watch, args=(spec.name,), name=f"watch-{spec.name}", daemon=True).start()
        last_lease = last_status = time.monotonic()
        while not self.stop.is_set():
            self.wake.wait(TICK_S)
            self.wake.clear()
            now = time.monotonic()
            try:
                if now - last_lease >= LEASE_RENEW_S:
                    self.renew_leases()
                    last_lease = now
                if now - last_status >= NODE_STATUS_S:
                    self.report_node_status()
                    last_status = now
                self.sync()
            except Exception:
                log.exception("sync failed; retrying")
        self.shutdown()

    def sync(self) -> None:
        """One level-triggered pass: every pod of our nodes against the local processes."""
        with self.lock:
            pods = {uid: pod for per_node in self.cache.values() for uid, pod in per_node.items()}
        for uid, pod in pods.items():
            lp = self.local.get(uid)
            phase = pod.get("status", {}).get("phase")
            deleting = bool(pod["metadata"].get("deletionTimestamp"))
            if lp is None:
                if deleting:
                    self.kube.delete_pod_now(pod["metadata"]["namespace"], pod["metadata"]["name"], uid)
                    continue
                if phase in ("Succeeded", "Failed"):
                    continue  # ran before this runtime started; nothing to run
                lp = self.admit(pod)
            if deleting:
                self.terminate(lp, pod)
                if lp.stopped:
                    self.kube.delete_pod_now(lp.namespace, lp.name, uid)
                    self.forget(lp)
                continue
            self.step(lp, pod)
            self.write_status(lp, pod)
        for uid, lp in list(self.local.items()):
            if uid not in pods:  # deleted behind our back (force delete): just stop
                self.terminate(lp, None)
                if lp.stopped:
                    self.forget(lp)

    def admit(self, pod: Manifest) -> LocalPod:
        meta = pod["metadata"]
        try:
            kind = "triton" if is_triton(pod) else "build" if is_engine_build(pod) else "unsupported"
        except PodError:
            kind = "unsupported"
        lp = LocalPod(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta["uid"],
            node=pod["spec"]["nodeName"],
            kind=kind,
            dir=self.pods_dir / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}",
            start_time=utcnow(),
        )
        lp.dir.mkdir(parents=True, exist_ok=True)
        self.local[lp.uid] = lp
        log.info("admitted %s (%s) on %s", lp.key, kind, lp.node)
        try:
            if kind == "unsupported":
                raise PodError("the local runtime runs tritonserver and tailtune.engine_builder pods only")
            lp.ip = self.pool.allocate(lp.uid)
            if kind == "triton":
                self.prepare_triton(lp, pod)
            else:
                self.prepare_build(lp, pod)
            self.launch(lp)
        except (PodError, EmulationError, OSError, RuntimeError, ApiError) as exc:
            log.warning("%s cannot run: %s", lp.key, exc)
            self.fail(lp, pod, "LocalRuntimeError", str(exc))
        return lp

    def fail(self, lp: LocalPod, pod: Manifest, reason: str, message: str) -> None:
        container = _container_or_none(pod)
        name = container.get("name", "main") if container else "main"
        image = container.get("image", "") if container else ""
        now = utcnow()
        term = ContainerView(name, image, "terminated", reason, message[:TERMINATION_MESSAGE_LIMIT], now, now, 128)
        lp.view = PodView("Failed", None, lp.start_time, (term,), reason=reason, message=message[:1024])
        if self.pool.release(lp.ip, lp.uid) and lp.ip:
            self.shim.close(lp.ip)
        lp.ip = None
        lp.stopped = True

    # ---- volumes -----------------------------------------------------------------------------------
    def volume_paths(self, lp: LocalPod, pod: Manifest) -> dict[str, Path]:
        """Each volume of the pod as a local folder: PVC -> its PV's hostPath, emptyDir/configMap -> pod dir."""
        paths: dict[str, Path] = {}
        ns = lp.namespace
        for volume in pod["spec"].get("volumes", []):
            name = volume["name"]
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                pvc = self.kube.read_pvc(ns, claim)
                if pvc is None or not pvc.get("spec", {}).get("volumeName"):
                    raise PodError(f"PersistentVolumeClaim {ns}/{claim} is missing or not bound")
                pv = self.kube.read_pv(pvc["spec"]["volumeName"])
                host = (pv or {}).get("spec", {}).get("hostPath", {}).get("path") or (pv or {}).get("spec", {}).get(
                    "local", {}
                ).get("path")
                if not host:
                    raise PodError(f"PersistentVolume of {ns}/{claim} has no hostPath or local path")
                paths[name] = Path(host)
                paths[name].mkdir(parents=True, exist_ok=True)
            elif "configMap" in volume:
                cm_name = volume["configMap"]["name"]
                cm = self.kube.read_config_map(ns, cm_name)
                if cm is None:
                    raise PodError(f'configmap "{cm_name}" not found')
                folder = lp.dir / "volumes" / name
                folder.mkdir(parents=True, exist_ok=True)
                for key, value in (cm.get("data") or {}).items():
                    (folder / key).write_text(value)
                paths[name] = folder
            else:  # emptyDir and anything else: a fresh folder of the pod
                paths[name] = lp.dir / "volumes" / name
                paths[name].mkdir(parents=True, exist_ok=True)
        return paths

    @staticmethod
    def mounts(container: Manifest, volumes: dict[str, Path]) -> Mounts:
        table: dict[str, str] = {}
        for m in container.get("volumeMounts", []):
            base = volumes.get(m["name"])
            if base is None:
                raise PodError(f"volumeMount {m['name']!r} names no volume")
            host = base / m["subPath"] if m.get("subPath") else base
            table[m["mountPath"].rstrip("/") or "/"] = str(host)
        return Mounts(table)

    @staticmethod
    def env(container: Manifest, mounts: Mounts) -> dict[str, str]:
        env = dict(os.environ)
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = mounts.translate(str(item["value"]))
        return env

    # ---- engine build pods -------------------------------------------------------------------------------
    def prepare_build(self, lp: LocalPod, pod: Manifest) -> None:
        container = _container(pod)
        mounts = self.mounts(container, self.volume_paths(lp, pod))
        argv = [mounts.translate(a) for a in _argv(container)]
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable  # the image's interpreter is this venv's
        if is_llm_pod(pod["metadata"].get("annotations") or {}):
            # No TensorRT-LLM here: the EMULATED build publishes a stand-in engine (devkit.llm.build).
            argv = [sys.executable, "-m", "devkit.llm.build", *argv[argv.index("tailtune.engine_builder") + 1 :]]
        lp.termination_log = lp.dir / "termination-log"
        lp.termination_log.write_text("")
        argv.append(f"--termination-log={lp.termination_log}")
        annotations = pod["metadata"].get("annotations") or {}
        if not is_llm_pod(annotations) and any(key.startswith(ANNOTATION_PREFIX) for key in annotations):
            # The build runs on this machine's CPU, not on the emulated accelerator the pods will serve with:
            # its own timing would describe the wrong device, so it reports the emulated device's ladder.
            argv.append("--no-timing")
            curve = curve_from_annotations(annotations)
            top = int(argv[argv.index("--max-batch") + 1]) if "--max-batch" in argv else 1
            lp.emulated_ladder = tuple((b, round(curve.ms(b), 3)) for b in ladder(top))
        lp.argv = argv
        lp.env = self.env(container, mounts)
        tmp = mounts.host_path("/tmp")
        if tmp:
            lp.env["TMPDIR"] = tmp

    # ---- Triton pods --------------------------------------------------------------------------------------
    def prepare_triton(self, lp: LocalPod, pod: Manifest) -> None:
        """Do the init container's job (repository from ConfigMap + engine), emulated; plan tritonserver."""
        assert lp.ip is not None
        container = _container(pod)
        volumes = self.volume_paths(lp, pod)
        mounts = self.mounts(container, volumes)
        args = _argv(container)
        model = flag_value(args, "--load-model")
        if not model:
            raise PodError("tritonserver has no --load-model: the local runtime serves one explicit model")
        config_text = _find_config(pod, volumes)
        engine_dir = mounts.host_path(f"/engines/{model}/1")
        pattern = "*" if is_llm_pod(pod["metadata"].get("annotations") or {}) else "model.*"
        artifacts = sorted(Path(engine_dir).glob(pattern)) if engine_dir else []
        if not artifacts:
            raise PodError(f"no engine for {model!r} in the engine store ({engine_dir}): was the build Job run?")
        annotations = pod["metadata"].get("annotations") or {}
        curve = curve_from_annotations(annotations)
        params = emulation_parameters(
            curve, device_lock=str(lp.dir / "emulated-gpu.lock"), site_packages=venv_site_packages()
        )
        repo = Path(mounts.host_path(flag_value(args, "--model-repository") or "/models") or lp.dir / "models")
        version = repo / model / "1"
        version.mkdir(parents=True, exist_ok=True)
        if is_llm_pod(annotations):  # a generative service: the EMULATED LLM serves in TensorRT-LLM's place
            try:
                llm = llm_from_annotations(annotations)
                llm = replace(llm, warmup_requests=warmup_requests(config_text) or llm.warmup_requests)
                config = parse_pbtxt(config_text)
                if is_trtllm_config(config):  # the operator's load-time settings (spec.serving.llm or the tuner's)
                    llm = with_trtllm_settings(llm, config)
            except LlmPodError as exc:
                raise PodError(str(exc)) from None
            write_llm_repository(repo, model, llm)
            params = {**params, **llm.parameters()}
        else:
            (repo / model / "config.pbtxt").write_text(emulate_pbtxt(config_text, params))
            model_py = resources.files("devkit.triton").joinpath("models", "emulated_gpu", "model.py")
            (version / "model.py").write_text(model_py.read_text())
        link = version / artifacts[0].name
        link.unlink(missing_ok=True)
        link.symlink_to(artifacts[0])  # the engine the pod would run; the emulated device does not read it
        http_port = int(flag_value(args, "--http-port") or 8000)
        grpc_port = int(flag_value(args, "--grpc-port") or 8001)
        install = find_triton()
        argv = server_command(
            install,
            prepare_backend_dir(install),
            repo,
            host=lp.ip,
            http_port=UPSTREAM_HTTP_PORT,
            grpc_port=UPSTREAM_GRPC_PORT,
            metrics_port=int(flag_value(args, "--metrics-port") or 8002),
            load_models=[model],
            extra_args=without_flags(args[1:], _SERVER_FLAGS),
        )
        env = self.env(container, mounts)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(install.libs), env.get("LD_LIBRARY_PATH")) if p)
        env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
        lp.argv, lp.env = argv, env
        self.shim.serve(
            lp.ip, http=(http_port, UPSTREAM_HTTP_PORT), grpc_ports=(grpc_port, UPSTREAM_GRPC_PORT), parameters=params
        )
        probe = container.get("readinessProbe", {}).get("httpGet")
        if probe:
            port = _port(container, probe.get("port", http_port))
            lp.probe_url = f"http://{lp.ip}:{port}{probe.get('path', '/')}"
        (lp.dir / "emulation.json").write_text(json.dumps({"model": model, **params}, indent=2) + "\n")

    # ---- processes ---------------------------------------------------------------------------------------
    def launch(self, lp: LocalPod) -> None:
        log_path = lp.dir / "container.log"
        lp.process = Process.start(
            lp.argv, log_path=log_path, env=lp.env, cwd=lp.dir, pid_dir=self.pid_dir, name=f"{lp.key}"
        )
        lp.restart_at = None
        log.info("%s: started pid %d on %s", lp.key, lp.process.pid, lp.ip)

    def step(self, lp: LocalPod, pod: Manifest) -> None:
        """Advance one pod: restart after backoff, notice an exit, probe readiness; update its view."""
        if lp.stopped:
            return
        container = _container(pod)
        name, image = container["name"], container.get("image", "")
        if lp.process is None:
            if lp.restart_at is not None and time.monotonic() >= lp.restart_at:
                self.launch(lp)
            else:
                lp.view = self._waiting_view(lp, pod, name, image)
                return
        assert lp.process is not None
        code = lp.process.poll()
        if code is not None:
            self._exited(lp, pod, name, image, code)
            return
        if lp.probe_url:
            lp.ready = _probe(lp.probe_url)
        else:
            lp.ready = True
        running = ContainerView(
            name, image, "running", started_at=lp.process.started_at, ready=lp.ready, restart_count=lp.restarts,
            **_last_exit(lp),
        )  # fmt: skip
        lp.view = PodView("Running", lp.ip, lp.start_time, (running,), _init_views(pod, lp))

    def _waiting_view(self, lp: LocalPod, pod: Manifest, name: str, image: str) -> PodView:
        reason = "CrashLoopBackOff" if lp.restarts else "ContainerCreating"
        waiting = ContainerView(name, image, "waiting", reason, restart_count=lp.restarts, **_last_exit(lp))
        return PodView("Running" if lp.restarts else "Pending", lp.ip, lp.start_time, (waiting,), _init_views(pod, lp))

    def _exited(self, lp: LocalPod, pod: Manifest, name: str, image: str, code: int) -> None:
        assert lp.process is not None
        started, finished = lp.process.started_at, utcnow()
        log_path = lp.dir / "container.log"
        if code == 0 and lp.emulated_ladder and lp.termination_log:
            _report_emulated_ladder(lp.termination_log, lp.emulated_ladder)
        message = _tail(lp.termination_log) if lp.termination_log else ""
        policy = _container(pod).get("terminationMessagePolicy", "File")
        if not message.strip() and code != 0 and policy == "FallbackToLogsOnError":
            message = _tail(log_path, 2048)
        message = message.strip()
        log.info("%s: pid %d exited with %d", lp.key, lp.process.pid, code)
        lp.process = None
        if pod["spec"].get("restartPolicy", "Always") == "Always":
            lp.last_exit = (code, message or _tail(log_path, 1024).strip())
            lp.restart_at = time.monotonic() + RESTART_BACKOFF_S[min(lp.restarts, len(RESTART_BACKOFF_S) - 1)]
            lp.restarts += 1
            lp.ready = False
            lp.view = self._waiting_view(lp, pod, name, image)
            return
        reason = "Completed" if code == 0 else "Error"
        term = ContainerView(name, image, "terminated", reason, message, started, finished, code)
        lp.view = PodView("Succeeded" if code == 0 else "Failed", lp.ip, lp.start_time, (term,), _init_views(pod, lp))
        self.pool.release(lp.ip, lp.uid)  # a finished pod keeps its IP in status but holds no address
        lp.stopped = True

    def write_status(self, lp: LocalPod, pod: Manifest) -> None:
        if lp.view is None:
            return
        status = pod_status(lp.view, utcnow(), pod.get("status", {}).get("conditions", []))
        if status == lp.sent:
            return
        # Only the transition times move when nothing changed: compare without them.
        if lp.sent is not None and _strip_times(status) == _strip_times(lp.sent):
            return
        self.kube.patch_pod_status(lp.namespace, lp.name, status)
        lp.sent = status

    # ---- stopping ------------------------------------------------------------------------------------------
    def terminate(self, lp: LocalPod, pod: Manifest | None) -> None:
        """Stop a pod's processes in the background (grace from the pod, capped); `lp.stopped` when done."""
        if lp.stopped or lp.stopping is not None:
            if lp.stopping is not None and not lp.stopping.is_alive():
                lp.stopped = True
            return
        grace = float((pod or {}).get("metadata", {}).get("deletionGracePeriodSeconds") or 30)
        grace = min(grace, MAX_GRACE_S)
        # As the kubelet does: the preStop hook first, inside the grace period, then SIGTERM for what is left.
        pre_stop = min(pre_stop_seconds(pod), grace) if pod is not None else 0.0
        process = lp.process

        def stop() -> None:
            if process is not None:
                if pre_stop > 0:
                    log.info("%s: preStop sleep %.0f s", lp.key, pre_stop)
                    time.sleep(pre_stop)
                code = process.stop(grace - pre_stop)
                log.info("%s: stopped (exit %d)", lp.key, code)

        lp.stopping = threading.Thread(target=stop, name=f"stop-{lp.name}", daemon=True)
        lp.stopping.start()

    def forget(self, lp: LocalPod) -> None:
        # Only while the pod still holds its address: a finished pod's IP may be another pod's by now.
        if self.pool.release(lp.ip, lp.uid) and lp.ip:
            self.shim.close(lp.ip)
        self.local.pop(lp.uid, None)
        log.info("%s: gone", lp.key)

    def shutdown(self) -> None:
        """Stop every process (in parallel) and the shim."""
        threads = []
        for lp in self.local.values():
            if lp.process is not None:
                t = threading.Thread(target=lp.process.stop, args=(10.0,), daemon=True)
                t.start()
                threads.append(t)
        for t in threads:
            t.join(timeout=15)
        self.shim.shutdown()
        log.info("runtime stopped (%d pods' processes ended)", len(threads))


# The flags `server_command` sets itself; the pod's values for them are read, then replaced.
_SERVER_FLAGS = (
    "--model-repository",
    "--model-control-mode",
    "--load-model",
    "--http-port",
    "--grpc-port",
    "--metrics-port",
    "--http-address",
    "--grpc-address",
    "--metrics-address",
    "--backend-directory",
)


def _container_or_none(pod: Manifest) -> Manifest | None:
    containers: list[Manifest] = pod.get("spec", {}).get("containers", [])
    return containers[0] if containers else None


def _find_config(pod: Manifest, volumes: dict[str, Path]) -> str:
    """`config.pbtxt` from the pod's ConfigMap volume."""
    for volume in pod["spec"].get("volumes", []):
        if "configMap" in volume:
            path = volumes[volume["name"]] / "config.pbtxt"
            if path.exists():
                return path.read_text()
    raise PodError("no ConfigMap volume with a config.pbtxt")


def _port(container: Manifest, port: Any) -> int:
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        return int(port)
    for p in container.get("ports", []):
        if p.get("name") == port:
            return int(p["containerPort"])
    raise PodError(f"probe port {port!r} names no container port")


def _probe(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as response:
            return 200 <= int(response.status) < 400
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _init_views(pod: Manifest, lp: LocalPod) -> tuple[ContainerView, ...]:
    """Init containers: the runtime did their work (the model repository) before starting the container."""
    return tuple(
        ContainerView(c["name"], c.get("image", ""), "terminated", "Completed", "", lp.start_time, lp.start_time, 0)
        for c in pod["spec"].get("initContainers", [])
    )


def _last_exit(lp: LocalPod) -> dict[str, Any]:
    if lp.last_exit is None:
        return {}
    return {"last_exit_code": lp.last_exit[0], "last_message": lp.last_exit[1]}


def _strip_times(status: Manifest) -> Manifest:
    out = dict(status)
    out["conditions"] = [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status["conditions"]]
    return out


# ----------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    """Run the runtime until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m devkit.runtime", description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--workdir", type=Path, required=True, help="pod folders, logs and pid records")
    parser.add_argument("--node", action="append", help="node to own (repeatable); default demo-l4-0, demo-l4-1")
    parser.add_argument("--gpu-product", default="NVIDIA-L4")
    parser.add_argument("--gpus", type=int, default=4, help="nvidia.com/gpu per node")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    workdir: Path = args.workdir.resolve()
    for sub in ("pids", "pods"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    nodes = [NodeSpec(n, args.gpu_product, args.gpus) for n in (args.node or ["demo-l4-0", "demo-l4-1"])]
    runtime = Runtime(KubeClient.from_kubeconfig(args.kubeconfig), nodes, workdir)

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        runtime.stop.set()
        runtime.wake.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    runtime.run()
    shutil.rmtree(workdir / "pids", ignore_errors=True)
    return 0


def _report_emulated_ladder(path: Path, points: tuple[tuple[int, float], ...]) -> None:
    """Add the emulated device's service time to a successful build's report (its termination message)."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(report, dict):
        report["serviceTime"] = [{"batch": b, "ms": ms} for b, ms in points]
        path.write_text(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())

"""Pure: what pods say, read from their status as the API server serves it (JSON, camelCase).

A Triton pod that cannot serve says why in its own status: the container's termination message (Triton's log
tail, `terminationMessagePolicy: FallbackToLogsOnError`), exit code and restart count, or the pod's own reason
when it ended Failed (evicted, refused by the kubelet). `summarise_triton_pods` turns that into the words of
`ServingReady`, and names a failure loop instead of spinning in it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Pod = Mapping[str, Any]

# The kubelet's back-off doubles from 10 s: a container's third restart comes after >= 70 s of failing, and a
# ReplicaSet replaces a third pod that ended Failed: no longer a transient, a loop to be named.
FAILURE_LOOP = 3
# Waiting reasons the kubelet gives a container it cannot start or keeps restarting (not "still starting").
FAILING_WAITS = frozenset({
    "CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
    "CreateContainerError", "RunContainerError",
})  # fmt: skip
# Triton names a model it could not load ("failed to load 'm' version 1: ...") before it exits
# (--exit-on-error) and again in its last line ("failed to load all models").
_LOAD_FAILED = "failed to load"
_GLOG_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+\s+\S+:\d+\]\s*")
WORDS_MAX = 600  # a condition message stays readable in `kubectl describe`; the pod keeps the whole log


@dataclass(frozen=True)
class PodsSummary:
    """Why the Triton pods do not all serve, in words for `ServingReady`; "" where nothing to say."""

    ready_ips: tuple[str, ...] = ()
    unschedulable: str = ""  # the scheduler's message for a pod it cannot place
    not_ready: str = ""  # a pod still starting: a waiting reason or its Ready condition's message
    failing: str = ""  # live pods whose containers exit with an error or cannot start, with Triton's words
    failed: str = ""  # pods that ended Failed (evicted, refused by the kubelet), counted per ReplicaSet
    model_load_failed: bool = False  # Triton's own words say it failed to load the model


def termination_message(pod: Pod) -> str:
    """The first container's termination message (current state, then the last one), "" when none."""
    for cs in _status(pod).get("containerStatuses") or []:
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            message = (state.get("terminated") or {}).get("message")
            if message:
                return str(message)
    return ""


def unschedulable(pod: Pod) -> str:
    """The scheduler's message when the pod cannot be placed, "" otherwise."""
    for c in _status(pod).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("message") or c.get("reason") or "Unschedulable")
    return ""


def pod_ready(pod: Pod) -> bool:
    """The pod's Ready condition is True."""
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in _status(pod).get("conditions") or [])


def triton_words(message: str) -> str:
    """Triton's own line from a termination message (its log tail): the model it failed to load and why, else
    the last line; one line, without the glog prefix, at most `WORDS_MAX` characters."""
    lines = [_GLOG_PREFIX.sub("", line.strip()) for line in message.splitlines() if line.strip()]
    if not lines:
        return ""
    named = [line for line in lines if _LOAD_FAILED + " '" in line]  # a model named: the specific error
    unavailable = [line.strip("| ") for line in lines if "UNAVAILABLE:" in line]  # the model table's row
    chosen = (named or unavailable or lines)[0 if named or unavailable else -1]
    return chosen if len(chosen) <= WORDS_MAX else chosen[: WORDS_MAX - 1] + "…"


def summarise_triton_pods(pods: Sequence[Pod]) -> PodsSummary:
    """What the Deployment's pods say: the ready ones' IPs, and for the others the most telling reason."""
    ready_ips, unplaced, not_ready = [], "", ""
    failing: list[tuple[int, str, str]] = []  # (restarts, pod, what its container says)
    failed: list[tuple[str, str, str]] = []  # (creationTimestamp, pod, why) of pods that ended Failed
    failed_by_owner: Counter[str] = Counter()
    words: list[str] = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, _status(pod)
        name = str(meta.get("name", ""))
        if meta.get("deletionTimestamp") or status.get("phase") == "Succeeded":
            continue
        if status.get("phase") == "Failed":
            why, said = _pod_failure(pod)
            failed.append((str(meta.get("creationTimestamp", "")), name, why))
            failed_by_owner[_owner(meta)] += 1
            words.append(said)
            continue
        if pod_ready(pod):
            if status.get("podIP"):
                ready_ips.append(str(status["podIP"]))
            continue
        crash = _container_failure(pod)
        if crash is not None:
            restarts, why, said = crash
            failing.append((restarts, name, why))
            words.append(said)
            continue
        unplaced = unschedulable(pod) or unplaced
        not_ready = _still_starting(pod) or not_ready
    return PodsSummary(
        ready_ips=tuple(sorted(ready_ips)),
        unschedulable=unplaced,
        not_ready=not_ready,
        failing=_failing_text(failing),
        failed=_failed_text(failed, failed_by_owner),
        model_load_failed=any(_LOAD_FAILED in w for w in words),
    )


def _status(pod: Pod) -> Mapping[str, Any]:
    return pod.get("status") or {}


def _owner(meta: Mapping[str, Any]) -> str:
    return next((str(o.get("name")) for o in meta.get("ownerReferences") or [] if o.get("kind") == "ReplicaSet"), "")


def _containers(pod: Pod) -> list[tuple[str, Mapping[str, Any]]]:
    """(how to name it, status) of the init containers, then the containers."""
    status = _status(pod)
    init = [(f"init container {cs.get('name')}", cs) for cs in status.get("initContainerStatuses") or []]
    return init + [(f"container {cs.get('name')}", cs) for cs in status.get("containerStatuses") or []]


def _exit_text(label: str, terminated: Mapping[str, Any], notes: Sequence[str] = ()) -> tuple[str, str]:
    """('container triton exited 1 (Error), <notes>: <Triton's line>', the whole termination message)."""
    message = str(terminated.get("message") or "")
    reason = terminated.get("reason")
    head = ", ".join([f"{label} exited {terminated.get('exitCode')}" + (f" ({reason})" if reason else ""), *notes])
    said = triton_words(message)
    return (f"{head}: {said}" if said else f"{head}; no termination message"), message


def _container_failure(pod: Pod) -> tuple[int, str, str] | None:
    """(restarts, what the failing container says, its whole message) of a live pod, None when none fails.

    A container fails when it ended with an error, waits in a failing state (CrashLoopBackOff, an image it
    cannot pull), or runs again, not ready, after exiting with an error (the next try of a loop).
    """
    for label, cs in _containers(pod):
        state, last = cs.get("state") or {}, cs.get("lastState") or {}
        terminated, waiting = state.get("terminated") or {}, state.get("waiting") or {}
        last_error = last.get("terminated") if (last.get("terminated") or {}).get("exitCode") else None
        restarts = int(cs.get("restartCount") or 0)
        notes = [waiting["reason"]] if waiting.get("reason") in FAILING_WAITS else []
        if restarts:
            loop = " (a failure loop)" if restarts >= FAILURE_LOOP else ""
            notes.append(f"{restarts} restart{'s' if restarts != 1 else ''}{loop}")
        if terminated.get("exitCode"):
            why, said = _exit_text(label, terminated, notes)
        elif last_error and (waiting.get("reason") in FAILING_WAITS or not cs.get("ready")):
            why, said = _exit_text(label, last_error, notes)
        elif waiting.get("reason") in FAILING_WAITS:  # never ran: an image it cannot pull, a config it cannot make
            said = str(waiting.get("message") or "")
            why = ", ".join([label, *notes]) + (f": {said}" if said else "")
        else:
            continue
        return restarts, why, said
    return None


def _pod_failure(pod: Pod) -> tuple[str, str]:
    """(why a pod ended Failed, the words it left): the pod's reason (Evicted, a kubelet refusal), else the
    container that ended with an error."""
    status = _status(pod)
    if status.get("reason") or status.get("message"):
        said = str(status.get("message") or "")
        return ": ".join(p for p in (str(status.get("reason") or "Failed"), said) if p), said
    for label, cs in _containers(pod):
        terminated = (cs.get("state") or {}).get("terminated") or {}
        if terminated.get("exitCode"):
            return _exit_text(label, terminated)
    return "Failed", ""


def _still_starting(pod: Pod) -> str:
    for label, cs in _containers(pod):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return f"{label}: {waiting['reason']}"
    for c in _status(pod).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "False" and c.get("message"):
            return str(c["message"])
    return ""


def _failing_text(failing: list[tuple[int, str, str]]) -> str:
    if not failing:
        return ""
    _, name, why = max(failing)  # the pod that has failed most tells the loop
    many = f"{len(failing)} pods failing; e.g. " if len(failing) > 1 else ""
    return f"{many}pod {name}: {why}"


def _failed_text(failed: list[tuple[str, str, str]], by_owner: Counter[str]) -> str:
    """The failed pods of the ReplicaSet with most of them and why the latest failed. No pod name, and a loop's
    count in decades: the ReplicaSet makes a new pod a second, and the status must not be rewritten for each."""
    if not failed:
        return ""
    _, name, why = max(failed)  # the latest pod to fail
    if len(failed) == 1:
        return f"pod {name} ended Failed: {why}"
    owner, count = by_owner.most_common(1)[0]
    of = f" of ReplicaSet {owner}" if owner else ""
    loop = ", a failure loop: the ReplicaSet keeps replacing them" if count >= FAILURE_LOOP else ""
    pods = f"{_decade(len(failed))} failed pods" + (f" ({_decade(count)}{of})" if len(by_owner) > 1 else of)
    return f"{pods}{loop}; the latest: {why}"


def _decade(n: int) -> str:
    """12 -> '10+', 435 -> '100+'; exact under 10."""
    return str(n) if n < 10 else f"{10 ** (len(str(n)) - 1)}+"

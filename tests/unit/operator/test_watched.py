"""What the operator knows of an object without asking the API server (`tailtune.operator.watched`)."""

from __future__ import annotations

from typing import Any

from tailtune.operator.watched import ECHO_TIMEOUT_SECONDS, PodIps, WriteEchoes

KEY = ("ml", "svc")


def body(version: str, **annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": "svc", "namespace": "ml", "resourceVersion": version, "annotations": annotations}}


def test_our_write_is_read_until_the_watch_shows_it() -> None:
    """Caught: a tick that reads kopf's body right after its own annotation write reconciled without it (the config in
    force it had just changed), since the watch shows a write a moment later."""
    echoes = WriteEchoes()
    echoes.wrote(KEY, body("12", state="new"), now=0.0)
    assert echoes.freshest(KEY, body("11", state="old"), now=0.1)["metadata"]["annotations"] == {"state": "new"}
    # The watch shows our version, or a later one (someone else's change after ours): the watch is the truth again.
    assert echoes.freshest(KEY, body("12", state="new"), now=0.2)["metadata"]["resourceVersion"] == "12"
    assert echoes.freshest(KEY, body("11", state="old"), now=0.3)["metadata"]["resourceVersion"] == "11"
    echoes.wrote(KEY, body("20", state="ours"), now=1.0)
    assert echoes.freshest(KEY, body("21", spec="theirs"), now=1.1)["metadata"]["annotations"] == {"spec": "theirs"}


def test_a_write_the_watch_never_shows_is_not_waited_for_past_the_timeout() -> None:
    """Caught: with versions that are not numbers and a skipped event, the object's own write would shadow every later
    change kopf's watch delivers."""
    echoes = WriteEchoes()
    echoes.wrote(KEY, body("b", state="ours"), now=0.0)
    assert echoes.freshest(KEY, body("c", spec="theirs"), now=1.0)["metadata"]["resourceVersion"] == "b"
    later = echoes.freshest(KEY, body("c", spec="theirs"), now=ECHO_TIMEOUT_SECONDS + 0.1)
    assert later["metadata"]["resourceVersion"] == "c"


def test_pods_are_listed_again_only_when_the_deployment_moved() -> None:
    """Caught: the tuner listed the Triton pods every tick (a LIST per object per tick at rest)."""
    ips = PodIps()
    assert ips.get(KEY, "7") is None
    ips.put(KEY, "7", ("10.0.0.1",))
    assert ips.get(KEY, "7") == ("10.0.0.1",)
    assert ips.get(KEY, "8") is None  # a pod became ready, or went
    ips.put(KEY, "", ("10.0.0.2",))  # listed without a known Deployment version: never reused
    assert ips.get(KEY, "") is None and ips.get(KEY, "7") is None

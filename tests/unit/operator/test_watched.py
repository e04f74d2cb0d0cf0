"""What the operator knows of an object without asking the API server (`tailtune.operator.watched`)."""

from __future__ import annotations

from typing import Any

from tailtune.operator.watched import ECHO_TIMEOUT_SECONDS, ChildVersions, ParsedBodies, PodIps, WriteEchoes

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


def test_a_resync_re_applies_only_children_the_watch_has_not_shown_as_applied() -> None:
    """Caught: the drift resync server-side applied every serving child of every object every 300 s at rest (0.30
    writes per object per tick at 300 objects), though the watch had shown each of them as our apply left it."""
    cm, dep = ("ConfigMap", "ml", "svc-model"), ("Deployment", "ml", "svc-triton")
    children = ChildVersions(watched_kinds={"Deployment", "ConfigMap"})
    assert not children.as_applied(KEY)  # nothing applied by this process yet (a restart): the resync applies
    children.applied_now(KEY, cm, "100")
    children.applied_now(KEY, dep, "3")
    assert not children.as_applied(KEY)  # applied, not yet shown by the watch
    children.saw(cm, "100")
    children.saw(dep, "3")
    assert children.as_applied(KEY)
    children.saw(cm, "104")  # someone else's edit (the drift check re-applies it at the event)
    assert not children.as_applied(KEY)
    children.applied_now(KEY, cm, "105")
    children.saw(cm, "105")
    assert children.as_applied(KEY)
    children.saw(dep, None)  # deleted by hand: applied again
    assert not children.as_applied(KEY)
    children.saw(dep, "1")
    children.applied_now(KEY, dep, "1")
    assert children.as_applied(KEY)
    # A kind this process does not watch (no list/watch on Services) is never known as applied: always re-applied.
    children.applied_now(KEY, ("Service", "ml", "svc"), "7")
    children.saw(("Service", "ml", "svc"), "7")
    assert not children.as_applied(KEY)
    children.forget(KEY)
    assert not children.as_applied(KEY) and not children.applied and not children.seen


def test_a_body_is_parsed_once_per_version() -> None:
    """Caught: the fast path's check every 2 s and the tick's three reads validated the same version of the body into
    the API's model each time (the most of the operator's CPU at rest, sampled at 300 objects)."""
    parses: list[str] = []

    def parse(raw: dict[str, Any]) -> str:
        parses.append(raw["metadata"]["resourceVersion"])
        return str(raw["metadata"]["annotations"])

    parsed = ParsedBodies(parse)
    first = {**body("5", a="1"), "metadata": {**body("5", a="1")["metadata"], "uid": "u1"}}
    assert parsed(first) == parsed(dict(first)) == "{'a': '1'}"
    assert parses == ["5"]
    moved = {**first, "metadata": {**first["metadata"], "resourceVersion": "6", "annotations": {"a": "2"}}}
    assert parsed(moved) == "{'a': '2'}" and parses == ["5", "6"]
    assert parsed(body("7")) == parsed(body("7")) and parses == ["5", "6", "7", "7"]  # no uid: parsed every time
    parsed.forget("u1")
    assert parsed(moved) == "{'a': '2'}" and parses[-1] == "6" and len(parses) == 5

"""Which InferenceServices this operator process serves: its shard, a label selector (`tailtune operator --shard`).

Operators on disjoint shards serve one cluster side by side, each with its own peering name (an HA pair per shard).
The selector is Kubernetes' equality-based syntax: `key=value`, `key!=value`, `key` (the label is there), `!key` (it
is not), joined by commas, all of which must hold. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# A label key: an optional DNS-subdomain prefix and a name (Kubernetes' label syntax), and a label value.
_KEY = r"(?:[a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_VALUE = r"(?:[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_TERM = re.compile(rf"^(?P<absent>!)?(?P<key>{_KEY})(?:(?P<op>!=|==|=)(?P<value>{_VALUE}))?$")


class ShardSelectorError(ValueError):
    """A selector that does not parse: the message names the term and the syntax."""


@dataclass(frozen=True)
class Requirement:
    """One term of the selector."""

    key: str
    op: str  # "=", "!=", "exists", "absent"
    value: str = ""

    def holds(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "absent":
            return self.key not in labels
        if self.op == "=":
            return labels.get(self.key) == self.value
        return labels.get(self.key) != self.value


@dataclass(frozen=True)
class ShardSelector:
    """The shard's selector: every requirement holds for the object's labels."""

    requirements: tuple[Requirement, ...]
    text: str = ""

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        found = labels or {}
        return all(r.holds(found) for r in self.requirements)


def parse_shard_selector(text: str) -> ShardSelector:
    """The selector in `text`; ShardSelectorError names a term that is not `key=value`, `key!=value`, `key` or
    `!key`."""
    requirements = []
    for raw in text.split(","):
        term = raw.strip()
        m = _TERM.match(term)
        if not term or m is None or (m["absent"] and m["op"]):
            raise ShardSelectorError(
                f"--shard: {term!r} is not a label requirement: use key=value, key!=value, key or !key, "
                "joined by commas (e.g. tailtune.io/shard=a)"
            )
        if m["op"] is None:
            requirements.append(Requirement(m["key"], "absent" if m["absent"] else "exists"))
        else:
            requirements.append(Requirement(m["key"], "!=" if m["op"] == "!=" else "=", m["value"]))
    return ShardSelector(tuple(requirements), text)

"""The engine cache key: a pure hash of everything that makes a built engine valid.

The operator names the build Job after the key and the builder stores the engine under it,
so both sides must call `compute_cache_key` with the same inputs. Stdlib only, no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping

CACHE_KEY_PREFIX = "eng-"
# 16 hex chars = 64 bits: collisions are out of reach for one store, and the key stays
# short enough to be a Job name (DNS-1123 label, 63 chars) with room for suffixes.
CACHE_KEY_HEX_CHARS = 16
# Bump when the meaning of an input changes, so old entries stop matching.
CACHE_KEY_SCHEMA = 1

FlagValue = str | int | bool
_SHA256 = re.compile(r"(?:sha256:)?([0-9a-fA-F]{64})")


def compute_cache_key(
    *,
    model_digest: str,
    tensorrt_version: str,
    gpu_product: str,
    compute_capability: str,
    precision: str,
    profile: tuple[int, int, int],
    flags: Mapping[str, FlagValue],
) -> str:
    """Return `eng-` + 16 hex chars of sha256 over a canonical JSON of the inputs.

    `profile` is (min, opt, max) of the batch dim. `flags` holds every other builder
    setting that changes the engine; its ordering does not matter, its types do
    (`1` and `True` and `"1"` give different keys).
    """
    if len(profile) != 3 or not all(_is_int(p) for p in profile):
        raise ValueError(f"profile must be three ints (min, opt, max), got {profile!r}")
    for name, value in flags.items():
        if not isinstance(name, str) or not isinstance(value, str | int | bool):
            raise ValueError(f"flag {name!r} must map a str to a str, int or bool, got {value!r}")
    canonical = json.dumps(
        {
            "schema": CACHE_KEY_SCHEMA,
            "model_digest": _normalize_digest(model_digest),
            "tensorrt_version": tensorrt_version,
            "gpu_product": gpu_product,
            "compute_capability": compute_capability,
            "precision": precision,
            "profile": list(profile),
            "flags": dict(flags),
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
    )
    digest = hashlib.sha256(canonical.encode("ascii")).hexdigest()
    return CACHE_KEY_PREFIX + digest[:CACHE_KEY_HEX_CHARS]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _normalize_digest(digest: str) -> str:
    """`sha256:ABC…` and `abc…` name the same bytes; any other digest form is kept as given."""
    match = _SHA256.fullmatch(digest.strip())
    return match.group(1).lower() if match else digest

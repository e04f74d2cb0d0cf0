"""Spec rules only the operator can judge (the schema cannot express them).

Pure: each check returns a message naming the field and the fix, or None.
"""

from __future__ import annotations

import re
import string

from pydantic import ValidationError

from tailtune.api.keys import GPU_PRODUCT_LABEL, GPU_RESOURCE
from tailtune.api.v1alpha1 import InferenceService

_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")
_QUERY_FIELDS = {"namespace", "name", "model", "window"}
# The Service is named after the object and `app.kubernetes.io/instance` carries the name: a DNS-1035 label.
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NAME_MAX = 63
# Where a field the API server names on a child comes from in the spec (first match wins).
_CHILD_FIELDS: tuple[tuple[str, str], ...] = (
    ("affinity", "spec.serving.affinity"),  # before nodeSelector: affinity has nodeSelectorTerms
    ("nodeSelector", "spec.serving.nodeSelector"),
    ("tolerations", "spec.serving.tolerations"),
    ("resources", "spec.serving.resources"),
    ("annotations", "{pod_annotations}"),
    ("metadata.labels", "metadata.name (its length)"),
    ("metadata.name", "metadata.name"),
    ("image", "{image}"),
)


def describe_validation_error(exc: ValidationError) -> str:
    """One line per problem, each naming the field path in wire (camelCase) form."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc}: {err['msg']}" if loc else str(err["msg"]))
    return "; ".join(parts)


def check_spec(isvc: InferenceService) -> str | None:
    """The first rule the spec breaks, as 'field: problem; fix', or None."""
    for check in (_object_name, _gpu_selector, _gpu_in_resources, _quantities, _latency_query, _pvc_uri):
        problem = check(isvc)
        if problem:
            return problem
    return None


def describe_rejection(isvc: InferenceService, kind: str, name: str, message: str, fields: tuple[str, ...]) -> str:
    """A child the API server refused, as 'kind name: server's words; fix field': the spec field it comes from."""
    job = kind == "Job"
    values = {
        "pod_annotations": "spec.engine.podAnnotations" if job else "spec.serving.podAnnotations",
        "image": "spec.engine.builderImage" if job else "spec.serving.tritonImage",
    }
    named = " ".join(fields) or message
    source = next((spec.format(**values) for needle, spec in _CHILD_FIELDS if needle in named), None)
    fix = f"; fix {source}" if source else "; fix the spec field it names"
    return f"the API server refused {kind} {name}: {message}{fix}"


def _object_name(isvc: InferenceService) -> str | None:
    name = isvc.metadata.name
    if len(name) > NAME_MAX or not _DNS_1035.match(name):
        return (
            f"metadata.name {name!r} cannot name the Service and the instance label: it must be a DNS-1035 label "
            f"(at most {NAME_MAX} characters: lower-case letters, digits and '-', starting with a letter); "
            "recreate the object under such a name"
        )
    return None


def _gpu_selector(isvc: InferenceService) -> str | None:
    serving = isvc.spec.serving
    chosen = serving.node_selector.get(GPU_PRODUCT_LABEL)
    if chosen is not None and chosen != serving.gpu.product:
        return (
            f"spec.serving.nodeSelector[{GPU_PRODUCT_LABEL}]={chosen} conflicts with "
            f"spec.serving.gpu.product={serving.gpu.product}; remove it from nodeSelector"
        )
    return None


def _gpu_in_resources(isvc: InferenceService) -> str | None:
    res = isvc.spec.serving.resources
    for part, values in (("requests", res.requests), ("limits", res.limits)):
        if GPU_RESOURCE in values:
            return f"spec.serving.resources.{part}[{GPU_RESOURCE}] is managed by tailtune; set spec.serving.gpu.count"
    return None


def _quantities(isvc: InferenceService) -> str | None:
    res = isvc.spec.serving.resources
    for part, values in (("requests", res.requests), ("limits", res.limits)):
        for key, value in values.items():
            if not _QUANTITY.match(value):
                return (
                    f"spec.serving.resources.{part}.{key}: {value!r} is not a Kubernetes quantity; "
                    "use e.g. '500m', '2' or '8Gi'"
                )
    return None


def _latency_query(isvc: InferenceService) -> str | None:
    query = isvc.spec.metrics.latency_query
    if query is None:
        return None
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(query) if f is not None}
    except ValueError as exc:
        return f"spec.metrics.latencyQuery: {exc}; write literal braces as {{{{ and }}}}"
    unknown = sorted(fields - _QUERY_FIELDS)
    if unknown:
        return (
            f"spec.metrics.latencyQuery uses unknown placeholder {{{unknown[0]}}}; "
            f"allowed: {', '.join('{' + f + '}' for f in sorted(_QUERY_FIELDS))} (write literal braces doubled)"
        )
    return None


def _pvc_uri(isvc: InferenceService) -> str | None:
    uri = isvc.spec.model.uri
    if uri.startswith("pvc://"):
        claim, _, path = uri.removeprefix("pvc://").partition("/")
        if not claim or not path:
            return f"spec.model.uri {uri!r}: a pvc URI needs a claim and a path, e.g. pvc://models/bert/model.onnx"
    return None

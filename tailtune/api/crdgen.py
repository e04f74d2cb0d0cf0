"""Generate the InferenceService CRD from the pydantic models (the only schema source).

The output is a structural OpenAPI v3 schema as Kubernetes wants it: no `$ref`, `nullable` instead of
`anyOf [X, null]`, no `additionalProperties: false` beside `properties`, defaults in wire (camelCase) form,
and CEL rules from each model's `cel` table as `x-kubernetes-validations`.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from tailtune.api import v1alpha1 as api
from tailtune.api.keys import NAME_LABEL, PART_OF_LABEL

JSON = dict[str, Any]


def _model_classes(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every pydantic model reachable from `root`, by class name (pydantic's `$defs` keys)."""
    found: dict[str, type[BaseModel]] = {}
    stack: list[type[BaseModel]] = [root]
    while stack:
        cls = stack.pop()
        if cls.__name__ in found:
            continue
        found[cls.__name__] = cls
        for field in cls.model_fields.values():
            stack.extend(_models_in(field.annotation))
    return found


def _models_in(tp: Any) -> list[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    out: list[type[BaseModel]] = []
    for arg in getattr(tp, "__args__", ()) or ():
        out.extend(_models_in(arg))
    for meta in getattr(tp, "__metadata__", ()) or ():
        out.extend(_models_in(meta))
    origin = getattr(tp, "__origin__", None)
    if origin is not None and origin is not tp:
        out.extend(_models_in(origin))
    return out


def _wire_default(cls: type[BaseModel], name: str) -> tuple[bool, Any]:
    field = cls.model_fields[name]
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return False, None
    else:
        value = field.default
    if value is None:
        return False, None
    if isinstance(value, BaseModel):
        return True, value.model_dump(by_alias=True, mode="json", exclude_none=True)
    return True, value


def _convert(node: Any, defs: JSON, classes: dict[str, type[BaseModel]]) -> Any:
    if isinstance(node, list):
        return [_convert(n, defs, classes) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        name = node.pop("$ref").split("/")[-1]
        merged = _model_schema(name, defs, classes)
        merged.update({k: v for k, v in node.items() if k in ("description", "default")})
        return merged
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o != {"type": "null"}]
        if len(options) != 1:
            raise ValueError(f"cannot express anyOf {options} structurally")
        inner = _convert(options[0], defs, classes)
        inner.update({k: _convert(v, defs, classes) for k, v in node.items() if k not in ("title", "default")})
        inner["nullable"] = True
        return inner
    if "allOf" in node and len(node["allOf"]) == 1:
        inner = _convert(node.pop("allOf")[0], defs, classes)
        inner.update({k: v for k, v in node.items() if k != "title"})
        return inner
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if "exclusiveMinimum" in node:
        node["minimum"] = node.pop("exclusiveMinimum")
        node["exclusiveMinimum"] = True
    if "exclusiveMaximum" in node:
        node["maximum"] = node.pop("exclusiveMaximum")
        node["exclusiveMaximum"] = True
    if node.get("additionalProperties") is False:
        del node["additionalProperties"]
    if node.get("type") == "object" and node.get("additionalProperties") is True:
        del node["additionalProperties"]
        node["x-kubernetes-preserve-unknown-fields"] = True
    if node.get("type") == "object" and "properties" not in node and "additionalProperties" not in node:
        node["x-kubernetes-preserve-unknown-fields"] = True
    out: JSON = {}
    for key, value in node.items():
        if key == "title":
            continue
        if key == "properties":
            out[key] = {k: _convert(v, defs, classes) for k, v in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = _convert(value, defs, classes)
        else:
            out[key] = value
    return out


def _model_schema(name: str, defs: JSON, classes: dict[str, type[BaseModel]]) -> JSON:
    cls = classes[name]
    raw = dict(defs[name])
    raw.pop("default", None)
    schema: JSON = _convert(raw, defs, classes)
    props = schema.get("properties", {})
    for field_name, field in cls.model_fields.items():
        alias = field.alias or field_name
        if alias not in props:
            continue
        props[alias].pop("default", None)
        has_default, default = _wire_default(cls, field_name)
        if has_default:
            props[alias]["default"] = default
    cel = getattr(cls, "cel", ())
    if cel:
        rules = []
        for rule, message, field_path in cel:
            entry: JSON = {"rule": rule, "message": message}
            if field_path:
                entry["fieldPath"] = field_path
            rules.append(entry)
        schema["x-kubernetes-validations"] = rules
    if cls.__doc__ and "description" not in schema:
        schema["description"] = " ".join(cls.__doc__.split())
    return schema


def structural_schema(cls: type[BaseModel]) -> JSON:
    """The structural OpenAPI schema of one model class, fully inlined."""
    full = cls.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
    defs: JSON = dict(full.pop("$defs", {}))
    defs[cls.__name__] = full
    return _model_schema(cls.__name__, defs, _model_classes(cls))


def build_crd() -> JSON:
    """The InferenceService CustomResourceDefinition."""
    spec_schema = structural_schema(api.InferenceServiceSpec)
    status_schema = structural_schema(api.InferenceServiceStatus)
    ready = '.status.conditions[?(@.type=="Ready")].status'
    columns = [
        {"name": "Ready", "type": "string", "jsonPath": ready},
        {"name": "SLO", "type": "number", "jsonPath": ".spec.slo.latencyMs", "description": "SLO in ms"},
        {
            "name": "P99",
            "type": "number",
            "jsonPath": ".status.latency.cleanMs",
            "description": "Latency at spec.slo.percentile, ms, over the latest window after the last change",
        },
        {"name": "Batch", "type": "integer", "jsonPath": ".status.batching.maxBatchSize"},
        {"name": "Delay", "type": "integer", "jsonPath": ".status.batching.maxQueueDelayMicroseconds"},
        {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas.ready"},
        {
            "name": "Targets",
            "type": "string",
            "priority": 1,
            "jsonPath": ".status.latency.targetsSummary",
            "description": "Every spec.slo target: observed/target ms and whether it is met",
        },
        {
            "name": "Reason",
            "type": "string",
            "priority": 1,
            "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
        },
        {
            "name": "TTFT",
            "type": "string",
            "priority": 1,
            "jsonPath": ".status.generative.ttftSummary",
            "description": "Generative: time to the first token at spec.slo.ttft.percentile, observed/target ms",
        },
        {
            "name": "TPOT",
            "type": "string",
            "priority": 1,
            "jsonPath": ".status.generative.tpotSummary",
            "description": "Generative: time per output token at spec.slo.tpot.percentile, observed/target ms",
        },
        {
            "name": "Tok/s",
            "type": "number",
            "priority": 1,
            "jsonPath": ".status.generative.tokensPerSecond",
            "description": "Generative: output tokens per second, all pods",
        },
        {
            "name": "Running",
            "type": "integer",
            "priority": 1,
            "jsonPath": ".status.generative.runningSequences",
            "description": "Generative: sequences in the running batch, all pods",
        },
        {
            "name": "Waiting",
            "type": "integer",
            "priority": 1,
            "jsonPath": ".status.generative.waitingSequences",
            "description": "Generative: sequences waiting for admission, all pods",
        },
        {
            "name": "KV%",
            "type": "number",
            "priority": 1,
            "jsonPath": ".status.generative.kvCacheUsedPercent",
            "description": "Generative: KV-cache blocks in use, % (the fullest pod)",
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{api.PLURAL}.{api.GROUP}",
            "labels": {NAME_LABEL: "tailtune", PART_OF_LABEL: "tailtune"},
        },
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": list(api.SHORT_NAMES),
                "categories": list(api.CATEGORIES),
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "description": "InferenceService serves one model on Triton under a latency SLO.",
                            "type": "object",
                            "required": ["spec"],
                            "x-kubernetes-validations": [{"rule": r, "message": m} for r, m, _ in api.ROOT_CEL],
                            "properties": {
                                "apiVersion": {"type": "string", "description": "API version."},
                                "kind": {"type": "string", "description": "Kind."},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def render_crds() -> str:
    """The CRD file's exact text, as committed under `crds/`."""
    header = "# Generated by `tailtune crds` from tailtune/api; do not edit.\n"
    return header + yaml.dump(build_crd(), Dumper=_NoAliasDumper, sort_keys=False, width=120)


class _NoAliasDumper(yaml.SafeDumper):
    """Writes repeated sub-schemas out in full: Kubernetes tooling does not expect YAML anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


CRD_FILENAME = f"{api.PLURAL}.{api.GROUP}.yaml"

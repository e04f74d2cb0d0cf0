"""The committed CRD is the generated one, and it is structural."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tailtune.api.crdgen import CRD_FILENAME, build_crd, render_crds

ROOT = Path(__file__).resolve().parents[3]


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        out.append((path, node))
        for k, v in node.items():
            out.extend(_walk(v, f"{path}.{k}"))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_walk(v, f"{path}[{i}]"))
    return out


def test_committed_crd_is_current() -> None:
    committed = (ROOT / "crds" / CRD_FILENAME).read_text()
    assert committed == render_crds(), "run `tailtune crds --write crds`"


def test_chart_copy_is_current() -> None:
    chart_copy = ROOT / "charts" / "tailtune" / "crds" / CRD_FILENAME
    if chart_copy.exists():
        assert chart_copy.read_text() == render_crds(), "copy crds/ into charts/tailtune/crds/"


def test_schema_is_structural() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node, path
        assert "anyOf" not in node and "allOf" not in node and "oneOf" not in node, path
        assert "const" not in node, path
        if "properties" in node:
            assert node.get("type") == "object", path
            assert "additionalProperties" not in node, path


def test_every_spec_field_has_a_description() -> None:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    missing = [
        f"{path}.{name}"
        for path, node in _walk(spec)
        for name, prop in (node.get("properties") or {}).items()
        if isinstance(prop, dict) and not prop.get("description")
    ]
    assert missing == []


def test_cel_rules_and_defaults_are_there() -> None:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
    assert "self.tuning.maxBatchSize.max <= self.engine.optimizationProfile.max" in rules
    engine = spec["properties"]["engine"]
    assert engine["properties"]["optimizationProfile"]["default"] == {"opt": 8, "max": 32}
    assert engine["properties"]["precision"]["enum"] == ["fp32", "fp16", "bf16", "int8", "fp8"]
    assert spec["properties"]["slo"]["properties"]["latencyMs"]["exclusiveMinimum"] is True
    assert spec["properties"]["model"]["properties"]["sha256"]["nullable"] is True


def test_generative_rules_and_wide_columns() -> None:
    """Both directions of the generative CEL rule are in the CRD, and the generative figures are wide-only
    columns (caught: a column without priority 1 would widen the default `kubectl get tis` table)."""
    version = build_crd()["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    messages = [r["message"] for r in spec["x-kubernetes-validations"]]
    assert any(m.startswith("spec.model.kind generative needs spec.slo.ttft") for m in messages)
    assert any(m.startswith("spec.slo.ttft and spec.slo.tpot apply to generative") for m in messages)
    assert spec["properties"]["model"]["properties"]["kind"]["enum"] == ["request", "generative"]
    assert spec["properties"]["slo"]["properties"]["ttft"]["properties"]["percentile"]["maximum"] == 99.9
    wide = {c["name"]: c for c in version["additionalPrinterColumns"] if c["jsonPath"].startswith(".status.generative")}
    assert sorted(wide) == sorted(["TTFT", "TPOT", "Tok/s", "Running", "Waiting", "KV%"])
    assert all(c.get("priority") == 1 for c in wide.values())


def test_printer_columns_and_names() -> None:
    crd = build_crd()
    version = crd["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Ready", "SLO", "P99", "Batch", "Delay", "Replicas", "Targets", "Reason",
        "TTFT", "TPOT", "Tok/s", "Running", "Waiting", "KV%", "Age",
    ]  # fmt: skip
    assert crd["spec"]["names"]["shortNames"] == ["tis"]
    assert version["subresources"] == {"status": {}}
    assert yaml.safe_load(render_crds()) == crd

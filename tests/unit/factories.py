"""Chained builders of test InferenceServices (kueue-style: `make_isvc("a").gpu("NVIDIA-L4").obj()`)."""

from __future__ import annotations

import copy
from typing import Any

from tailtune.api import InferenceService


class IsvcBuilder:
    """Builds the raw dict of an InferenceService; `.obj()` parses it."""

    def __init__(self, name: str, namespace: str = "default") -> None:
        self.raw: dict[str, Any] = {
            "apiVersion": "tailtune.io/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 1},
            "spec": {
                "model": {
                    "uri": "https://models.example.com/m.onnx",
                    "inputs": [{"name": "x", "dataType": "TYPE_FP32", "dims": [16]}],
                    "outputs": [{"name": "y", "dataType": "TYPE_FP32", "dims": [4]}],
                },
                "serving": {"gpu": {"product": "NVIDIA-L4"}},
                "slo": {"latencyMs": 30},
            },
        }

    def set(self, path: str, value: Any) -> IsvcBuilder:
        """Set a dotted path in the raw object (creating maps on the way)."""
        node = self.raw
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
        return self

    def gpu(self, product: str, count: int = 1) -> IsvcBuilder:
        return self.set("spec.serving.gpu", {"product": product, "count": count})

    def backend(self, backend: str, precision: str = "fp16") -> IsvcBuilder:
        return self.set("spec.engine.backend", backend).set("spec.engine.precision", precision)

    def annotate(self, key: str, value: str) -> IsvcBuilder:
        return self._annotate(key, value)

    def _annotate(self, key: str, value: str) -> IsvcBuilder:
        self.raw["metadata"].setdefault("annotations", {})[key] = value
        return self

    def dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.raw)

    def obj(self) -> InferenceService:
        return InferenceService.model_validate(self.raw)


def make_isvc(name: str = "demo", namespace: str = "default") -> IsvcBuilder:
    return IsvcBuilder(name, namespace)

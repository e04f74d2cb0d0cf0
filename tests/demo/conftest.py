"""Shared helpers of the demo's tests: the demo's InferenceService, parsed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tailtune.api import InferenceService

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "demo.yaml"


@pytest.fixture
def demo_doc() -> dict[str, Any]:
    """examples/demo.yaml as a dict."""
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return doc


@pytest.fixture
def demo_isvc(demo_doc: dict[str, Any]) -> InferenceService:
    """examples/demo.yaml as the operator reads it."""
    demo_doc["metadata"] |= {"uid": "uid-demo", "generation": 1}
    return InferenceService.model_validate(demo_doc)

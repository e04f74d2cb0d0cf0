"""Rules only the operator can judge, and how a child the API server refuses is told: field named, fix given."""

from __future__ import annotations

import pytest

from tailtune.operator.spec_checks import check_spec, describe_rejection
from tests.unit.factories import make_isvc


@pytest.mark.parametrize("name", ["r" * 64, "res.net", "9lives", "Upper"])
def test_names_that_cannot_name_the_service_or_label(name: str) -> None:
    problem = check_spec(make_isvc(name).obj())
    assert problem is not None and problem.startswith("metadata.name") and "DNS-1035" in problem


def test_a_63_character_name_is_fine() -> None:
    assert check_spec(make_isvc("r" * 63).obj()) is None


@pytest.mark.parametrize(
    ("kind", "fields", "message", "fix"),
    [
        ("Job", ("spec.template.annotations",), "", "spec.engine.podAnnotations"),
        ("Deployment", ("spec.template.annotations",), "", "spec.serving.podAnnotations"),
        ("Job", ("spec.template.spec.nodeSelector",), "", "spec.serving.nodeSelector"),
        ("Deployment", ("spec.template.spec.tolerations[0].operator",), "", "spec.serving.tolerations"),
        (
            "Deployment",
            ("spec.template.spec.affinity.nodeAffinity.x.nodeSelectorTerms[0]",),
            "",
            "spec.serving.affinity",
        ),
        ("Deployment", ("spec.template.spec.containers[0].resources.limits[x]",), "", "spec.serving.resources"),
        ("Service", (), 'Service "a.b" is invalid: metadata.name: Invalid value', "metadata.name"),
        ("Job", ("spec.template.spec.containers[0].image",), "", "spec.engine.builderImage"),
    ],
)
def test_rejection_names_the_spec_field_to_fix(kind: str, fields: tuple[str, ...], message: str, fix: str) -> None:
    text = describe_rejection(make_isvc().obj(), kind, "child", message or f"{kind} is invalid", fields)
    assert text.startswith(f"the API server refused {kind} child: ")
    assert text.endswith(f"fix {fix}") or f"fix {fix} " in text, text


def test_rejection_without_a_known_field_still_says_what_to_do() -> None:
    text = describe_rejection(make_isvc().obj(), "Job", "eng", "something odd", ())
    assert "something odd" in text and "fix the spec field it names" in text


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("spec.engine.builderImage", " ", "engine.builderImage must be an image reference without blanks"),
        ("spec.tuning.preferredBatchSizes", [4, 64], "every tuning.preferredBatchSizes entry must be <="),
        ("spec.tuning.queueDelayMicroseconds", {"min": 0, "max": 5_000_000}, "must be <= 1000000"),
    ],
)
def test_the_parsed_spec_refuses_what_admission_refuses(path: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_isvc().set(path, value).obj()

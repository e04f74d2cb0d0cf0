"""The operator's shard: a label selector (`tailtune.operator.shard`)."""

from __future__ import annotations

import pytest

from tailtune.operator.shard import ShardSelectorError, parse_shard_selector


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("tailtune.io/shard=a", {"tailtune.io/shard": "a"}, True),
        ("tailtune.io/shard=a", {"tailtune.io/shard": "b"}, False),
        ("tailtune.io/shard=a", {}, False),
        ("tailtune.io/shard!=a", {}, True),
        ("tailtune.io/shard!=a", {"tailtune.io/shard": "a"}, False),
        ("team", {"team": "x"}, True),
        ("!team", {"team": "x"}, False),
        ("!team", {}, True),
        ("team=x, tier==gold", {"team": "x", "tier": "gold"}, True),
        ("team=x,tier=gold", {"team": "x", "tier": "silver"}, False),
    ],
)
def test_a_selector_matches_as_kubernetes_would(selector: str, labels: dict[str, str], matches: bool) -> None:
    """Caught: a shard that served objects of another shard (two operators reconciling one object) or none."""
    assert parse_shard_selector(selector).matches(labels) is matches


@pytest.mark.parametrize("selector", ["", "a=b,", "!a=b", "a in (b)", "Bad Key=x", "a=b c"])
def test_a_selector_that_does_not_parse_names_the_term_and_the_syntax(selector: str) -> None:
    with pytest.raises(ShardSelectorError, match=r"--shard: .* is not a label requirement: use key=value"):
        parse_shard_selector(selector)


def test_the_operator_refuses_a_selector_it_cannot_parse_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    """Caught: a typo in the chart's shard value started an operator that served nothing (or everything)."""
    from tailtune.cli import main

    assert main(["operator", "--shard", "tailtune.io/shard in (a)"]) == 2
    assert "--shard: 'tailtune.io/shard in (a)' is not a label requirement" in capsys.readouterr().err

"""The `tailtune` command: operator, crds, plan, simulate, demo."""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path


def _cmd_crds(args: argparse.Namespace) -> int:
    from tailtune.api.crdgen import CRD_FILENAME, render_crds

    text = render_crds()
    if args.check or args.write:
        target = Path(args.write or "crds") / CRD_FILENAME
        if args.check:
            current = target.read_text() if target.exists() else ""
            if current != text:
                print(
                    f"{target} differs from the pydantic models; run `tailtune crds --write crds`",
                    file=sys.stderr,
                )
                return 1
            return 0
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        return 0
    sys.stdout.write(text)
    return 0


def _cmd_operator(args: argparse.Namespace) -> int:
    from tailtune.operator.shard import ShardSelectorError, parse_shard_selector

    try:  # before kopf is imported: a bad selector is told at once
        shard = parse_shard_selector(args.shard) if args.shard is not None else None
    except ShardSelectorError as exc:
        print(f"tailtune operator: {exc}", file=sys.stderr)
        return 2

    import asyncio

    import kopf

    import tailtune.operator.handlers  # noqa: F401  (registers the handlers)
    from tailtune.operator.metrics import start_metrics_server

    # Prefix each of kopf's per-object lines ("Handler ... succeeded") with the object's namespace/name.
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[args.log_format.upper()], log_prefix=True)
    if args.metrics_port:
        start_metrics_server(args.metrics_port)
    namespaces = args.namespace or []
    peering = args.peering
    # Replicas of one Deployment cannot be numbered: "random" gives each a distinct kopf peering priority.
    priority = random.randint(1, 1_000_000_000) if args.priority == "random" else int(args.priority)
    asyncio.run(
        kopf.operator(
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=peering is None,
            peering_name=peering,
            priority=priority,
            liveness_endpoint=args.liveness,
            memo=kopf.Memo(watch_namespaces=tuple(namespaces), shard=shard),
        )
    )
    return 0


def _cmd_plan(rest: list[str]) -> int:
    from tailtune.offline.plan import main as plan_main

    code: int = plan_main(rest)
    return code


def _cmd_simulate(rest: list[str]) -> int:
    from tailtune.offline.simulate import main as simulate_main

    code: int = simulate_main(rest)
    return code


def _cmd_explain(rest: list[str]) -> int:
    from tailtune.operator.explain import main as explain_main

    return explain_main(rest)


def _cmd_demo(rest: list[str]) -> int:
    # The demo is the development harness's (devkit, beside the product), not the operator's: imported only here.
    try:
        from devkit.demo import main as demo_main
    except ImportError as error:
        print(
            "tailtune demo needs the development harness: the `devkit` package of a tailtune checkout and its extra "
            f"(`pip install -e '.[devkit]'` in the checkout, then run it from there); cannot import it: {error}",
            file=sys.stderr,
        )
        return 2
    code: int = demo_main(rest)
    return code


def build_parser() -> argparse.ArgumentParser:
    """Argument parser of the `tailtune` command."""
    parser = argparse.ArgumentParser(prog="tailtune", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    op = sub.add_parser("operator", help="run the operator (kopf)")
    op.add_argument("--namespace", "-n", action="append", help="watch only this namespace (repeatable)")
    op.add_argument("--peering", help="kopf peering name for HA (one active operator at a time)")
    op.add_argument(
        "--shard",
        help="serve only the InferenceServices this label selector selects (key=value, key!=value, key, !key; "
        "comma-joined): operators on disjoint shards, each with its own --peering, serve one cluster side by side",
    )
    op.add_argument("--priority", default="0", help="peering priority: an integer, or 'random' for HA replicas")
    op.add_argument("--metrics-port", type=int, default=0, help="serve the operator's Prometheus metrics here")
    op.add_argument("--log-format", choices=["plain", "full", "json"], default="full", help="log line format")
    op.add_argument("--verbose", action="store_true", help="debug logs")
    op.add_argument("--liveness", help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")

    crds = sub.add_parser("crds", help="print the generated CRD")
    crds.add_argument("--write", metavar="DIR", help="write it into DIR instead")
    crds.add_argument("--check", action="store_true", help="fail when the file in DIR (default crds/) is stale")

    sub.add_parser("plan", help="starting config and predicted P99 for a service curve and a load", add_help=False)
    sub.add_parser("simulate", help="what-if: a tuning policy on your measured curve and recorded trace",
                   add_help=False)  # fmt: skip
    sub.add_parser("explain", help="where the time goes for one InferenceService, and what the tuner does next",
                   add_help=False)  # fmt: skip
    sub.add_parser("demo", help="the whole loop on this machine (local cluster, real Triton, Prometheus, load)",
                   add_help=False)  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if argv and argv[0] == "plan":
        return _cmd_plan(argv[1:])
    if argv and argv[0] == "simulate":
        return _cmd_simulate(argv[1:])
    if argv and argv[0] == "explain":
        return _cmd_explain(argv[1:])
    if argv and argv[0] == "demo":
        return _cmd_demo(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "crds":
        return _cmd_crds(args)
    if args.command == "operator":
        return _cmd_operator(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())

"""Running helm against charts/tailtune: the binary from hack/cluster/build.sh, rendering, parsed output."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "tailtune"
VALUES = Path(__file__).resolve().parent / "values"
RELEASE, NAMESPACE = "tailtune", "tailtune-system"
# The local cluster's version. `go install` builds helm without the ldflags that set its default (v1.20), which the
# chart's kubeVersion rejects, so offline commands are told the version.
KUBE_VERSION = re.findall(r"^K8S_VERSION=(v[0-9.]+);", (REPO / "hack/cluster/build.sh").read_text(), re.M)[0]

Manifest = dict[str, Any]


@functools.cache
def helm_binary() -> Path:
    """helm from TAILTUNE_CLUSTER_BIN, else from build.sh's cache (it returns at once when built, as by setup.sh)."""
    given = os.environ.get("TAILTUNE_CLUSTER_BIN")
    if given:
        bin_dir = Path(given)
    else:
        build = subprocess.run(
            ["bash", str(REPO / "hack" / "cluster" / "build.sh")], capture_output=True, text=True, check=False
        )
        if build.returncode != 0:
            raise RuntimeError(f"hack/cluster/build.sh failed:\n{build.stderr[-4000:]}")
        bin_dir = Path(build.stdout.strip().splitlines()[-1])
    helm = bin_dir / "helm"
    if not os.access(helm, os.X_OK):
        raise RuntimeError(f"no helm in {bin_dir}: run hack/setup.sh")
    return helm


def helm(*args: str, env: dict[str, str] | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """Runs helm; the caller checks returncode (schema failures are expected in some tests)."""
    return subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, timeout=timeout_s, check=False, env=env
    )


def values_args(values_files: tuple[str, ...], sets: tuple[str, ...]) -> list[str]:
    """`-f tests/chart/values/NAME.yaml` per name, then `--set` per assignment."""
    return [*(f"--values={VALUES / f'{name}.yaml'}" for name in values_files), *(f"--set={s}" for s in sets)]


def template(*values_files: str, sets: tuple[str, ...] = (), crds: bool = False) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart as release `tailtune` in `tailtune-system`."""
    extra = ["--include-crds"] if crds else []
    return helm(
        "template", RELEASE, str(CHART), f"--namespace={NAMESPACE}", f"--kube-version={KUBE_VERSION}",
        *extra, *values_args(values_files, sets),
    )  # fmt: skip


def render(*values_files: str, sets: tuple[str, ...] = ()) -> list[Manifest]:
    """The rendered objects (no CRDs); fails the test with helm's stderr when rendering fails."""
    result = template(*values_files, sets=sets)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(objects: list[Manifest], kind: str, name: str | None = None, namespace: str | None = None) -> Manifest:
    """The one object of this kind (and name/namespace, when given)."""
    matches = [
        o
        for o in objects
        if o["kind"] == kind
        and (name is None or o["metadata"]["name"] == name)
        and (namespace is None or o["metadata"].get("namespace") == namespace)
    ]
    assert len(matches) == 1, (
        f"{len(matches)} {kind} {name or ''} in {[(o['kind'], o['metadata']['name']) for o in objects]}"
    )
    return matches[0]


def kinds(objects: list[Manifest]) -> list[str]:
    """Sorted kinds, one entry per object."""
    return sorted(o["kind"] for o in objects)


def notes(*values_files: str, sets: tuple[str, ...] = (), tmp: Path) -> str:
    """NOTES.txt rendered offline: `helm template` skips NOTES, so a copy of the chart renders it into a ConfigMap."""
    chart = tmp / "chart"
    shutil.copytree(CHART, chart)
    (chart / "notes.txt").write_text((CHART / "templates" / "NOTES.txt").read_text())
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data:\n  notes: {{ tpl (.Files.Get "notes.txt") . | toJson }}\n'
    )
    result = helm(
        "template", RELEASE, str(chart), f"--namespace={NAMESPACE}", f"--kube-version={KUBE_VERSION}",
        "--show-only=templates/zz-notes.yaml", *values_args(values_files, sets),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    text: str = yaml.safe_load(result.stdout)["data"]["notes"]
    return text

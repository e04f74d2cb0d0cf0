"""The tailtune checkout the harness runs from: the local cluster's build files, the examples, the CRDs.

devkit needs a source checkout, not only the installed packages: `find_checkout()` looks for one explicitly
(TAILTUNE_CHECKOUT, else the folder above this package, else the current directory and its parents) and says
what is missing when none is found.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# What a folder must hold to count as a checkout, relative to its root.
MARKERS = ("pyproject.toml", "hack/cluster/build.sh", "hack/cluster/nodes.yaml", "examples/demo.yaml", "crds")


class CheckoutNotFound(RuntimeError):
    """No tailtune checkout where devkit looked; the message lists the places and what they lack."""


@dataclass(frozen=True)
class Checkout:
    """Paths inside a tailtune checkout."""

    root: Path

    @property
    def cluster_dir(self) -> Path:
        """hack/cluster: build.sh, the Go modules, nodes.yaml, the kwok stages."""
        return self.root / "hack" / "cluster"

    @property
    def examples(self) -> Path:
        return self.root / "examples"

    @property
    def crds(self) -> Path:
        return self.root / "crds"

    @property
    def cache(self) -> Path:
        """.cache: the default home of the local cluster's and the demo's state."""
        return self.root / ".cache"


def missing_markers(root: Path) -> list[str]:
    """The MARKERS that `root` lacks."""
    return [marker for marker in MARKERS if not (root / marker).exists()]


def find_checkout() -> Checkout:
    """The checkout to use; raises CheckoutNotFound naming each place tried and what it lacked."""
    given = os.environ.get("TAILTUNE_CHECKOUT")
    if given:
        candidates = [Path(given).resolve()]
    else:
        here = Path.cwd().resolve()
        candidates = [Path(__file__).resolve().parent.parent, here, *here.parents]
    tried = []
    for root in dict.fromkeys(candidates):  # in order, without repeats
        missing = missing_markers(root)
        if not missing:
            return Checkout(root)
        tried.append(f"{root} (no {', '.join(missing)})")
    raise CheckoutNotFound(
        "devkit needs a tailtune source checkout (hack/cluster, examples/, crds/); run it from one or set "
        "TAILTUNE_CHECKOUT. Tried: " + "; ".join(tried)
    )

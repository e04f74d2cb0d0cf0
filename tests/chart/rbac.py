"""What the operator may do: the single table the rendered RBAC and the live API server are both checked against."""

from __future__ import annotations

# (apiGroup, resource, verbs) in every namespace the operator serves. Why each one is there is in
# charts/tailtune/templates/_helpers.tpl; changing one means changing both.
NAMESPACED: tuple[tuple[str, str, frozenset[str]], ...] = (
    ("tailtune.io", "inferenceservices", frozenset({"get", "list", "watch", "patch"})),
    ("tailtune.io", "inferenceservices/status", frozenset({"get", "patch"})),
    ("batch", "jobs", frozenset({"get", "list", "watch", "create", "patch", "delete"})),
    ("apps", "deployments", frozenset({"get", "list", "watch", "create", "patch"})),
    ("", "configmaps", frozenset({"list", "watch", "create", "patch"})),
    ("", "services", frozenset({"list", "watch", "create", "patch"})),
    ("", "pods", frozenset({"get", "list", "watch"})),
    ("", "events", frozenset({"create", "list"})),
)
# The only delete the operator has: build Jobs of cache keys no longer in force (kube.delete_obsolete_jobs).
DELETABLE = frozenset({("batch", "jobs")})
CRDS = ("apiextensions.k8s.io", "customresourcedefinitions", frozenset({"list", "watch"}))
NAMESPACES = ("", "namespaces", frozenset({"list", "watch"}))
CLUSTER_PEERINGS = ("kopf.dev", "clusterkopfpeerings", frozenset({"get", "list", "watch", "patch"}))
PEERINGS = ("kopf.dev", "kopfpeerings", frozenset({"get", "list", "watch", "patch"}))

# Out of the operator's needs: each must be forbidden, (verb, resource as kubectl names it, namespaced).
FORBIDDEN: tuple[tuple[str, str, bool], ...] = (
    ("get", "secrets", True),
    ("list", "secrets", True),
    ("delete", "deployments.apps", True),
    ("delete", "configmaps", True),
    ("delete", "services", True),
    ("delete", "pods", True),
    ("deletecollection", "jobs.batch", True),
    ("delete", "inferenceservices.tailtune.io", True),
    ("update", "inferenceservices.tailtune.io", True),
    ("update", "inferenceservices.tailtune.io/status", True),
    ("get", "configmaps", True),
    ("create", "pods", True),
    ("create", "pods/exec", True),
    ("create", "serviceaccounts/token", True),
    ("create", "rolebindings.rbac.authorization.k8s.io", True),
    ("create", "clusterroles.rbac.authorization.k8s.io", False),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", False),
    ("create", "customresourcedefinitions.apiextensions.k8s.io", False),
    ("patch", "nodes", False),
    ("impersonate", "serviceaccounts", True),
)


def kubectl_resource(group: str, resource: str) -> str:
    """`resource.group[/subresource]`, as FORBIDDEN names them."""
    base, slash, sub = resource.partition("/")
    return f"{base}.{group}{slash}{sub}" if group else resource


def flatten(rules: list[dict[str, list[str]]]) -> list[tuple[str, str, frozenset[str]]]:
    """Rendered RBAC rules as (group, resource, verbs), one entry per group and resource, sorted."""
    out: list[tuple[str, str, frozenset[str]]] = []
    for rule in rules:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, f"unexpected keys (resourceNames?) in {rule}"
        out += [(g, r, frozenset(rule["verbs"])) for g in rule["apiGroups"] for r in rule["resources"]]
    return sorted(out, key=lambda entry: (entry[0], entry[1]))

"""charts/tailtune rendered by helm: lint, the objects for representative values, the schema, the CRD copies."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from tailtune.api.v1alpha1 import InferenceServiceSpec
from tailtune.operator import metrics
from tests.chart import rbac
from tests.chart.helm import (
    CHART,
    KUBE_VERSION,
    NAMESPACE,
    REPO,
    Manifest,
    find,
    helm,
    kinds,
    notes,
    render,
    template,
    values_args,
)

SELECTOR = {
    "app.kubernetes.io/name": "tailtune",
    "app.kubernetes.io/instance": "tailtune",
    "app.kubernetes.io/component": "operator",
}
TRITON_POD_LABELS = {  # tailtune/operator/builders/common.py labels() for an InferenceService named `tailtune`
    "app.kubernetes.io/name": "tailtune",
    "app.kubernetes.io/instance": "tailtune",
    "app.kubernetes.io/component": "triton",
    "app.kubernetes.io/managed-by": "tailtune",
}


def container(objects: list[Manifest]) -> dict[str, Any]:
    spec = find(objects, "Deployment")["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["operator"]
    c: dict[str, Any] = spec["containers"][0]
    return c


# ---------------------------------------------------------------------------------------------- lint


@pytest.mark.parametrize("values", [(), ("ha",), ("monitoring",), ("namespaced",)], ids=str)
def test_lint_is_clean(values: tuple[str, ...]) -> None:
    result = helm("lint", "--strict", str(CHART), f"--kube-version={KUBE_VERSION}", *values_args(values, ()))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


# ----------------------------------------------------------------------------------- default values


def test_default_objects() -> None:
    objects = render()
    assert kinds(objects) == [
        "ClusterKopfPeering",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",  # the dashboard
        "Deployment",
        "PersistentVolumeClaim",  # the engine store
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    ]
    for o in objects:
        if o["kind"] not in ("ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering"):
            assert o["metadata"]["namespace"] == NAMESPACE, o["kind"]


def test_two_replicas_with_peering_and_a_budget() -> None:
    objects = render()
    deployment = find(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["selector"] == {"matchLabels": SELECTOR}
    assert find(objects, "ClusterKopfPeering")["metadata"]["name"] == "tailtune"
    c = container(objects)
    # Each replica draws a distinct priority (--priority=random): kopf freezes all replicas that share one.
    assert c["command"] == ["tailtune", "operator"]
    assert c["args"] == [
        "--peering=tailtune", "--priority=random", "--liveness=http://0.0.0.0:8080/healthz", "--metrics-port=9090",
    ]  # fmt: skip
    assert {"name": "POD_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in c["env"]
    pdb = find(objects, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": SELECTOR}}


def test_operator_selector_never_matches_triton_pods() -> None:
    """Triton pods share name=tailtune and, for an InferenceService named like the release, instance too."""
    assert not SELECTOR.items() <= TRITON_POD_LABELS.items()


def test_security_context() -> None:
    objects = render()
    pod = find(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    c = container(objects)
    assert c["securityContext"] == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert c["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    assert pod["serviceAccountName"] == "tailtune"


def test_probes_ports_and_resources() -> None:
    objects = render()
    c = container(objects)
    assert c["ports"] == [{"name": "liveness", "containerPort": 8080}, {"name": "metrics", "containerPort": 9090}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert c["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}
    assert c["image"] == "ghcr.io/tailtune/operator:0.1.0"
    service = find(objects, "Service", "tailtune-metrics")
    assert service["spec"]["selector"] == SELECTOR
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]


def test_replicas_prefer_different_nodes() -> None:
    affinity = find(render(), "Deployment")["spec"]["template"]["spec"]["affinity"]
    (term,) = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"] == {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": SELECTOR},
    }


# ----------------------------------------------------------------------------------------------- RBAC


def test_cluster_role_is_exactly_what_the_operator_uses() -> None:
    objects = render()
    role = find(objects, "ClusterRole", "tailtune")
    expected = [rbac.CRDS, rbac.CLUSTER_PEERINGS, *rbac.NAMESPACED]
    assert rbac.flatten(role["rules"]) == sorted(expected, key=lambda e: (e[0], e[1]))
    binding = find(objects, "ClusterRoleBinding", "tailtune")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tailtune"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tailtune", "namespace": NAMESPACE}]


@pytest.mark.parametrize("values", [(), ("namespaced",)], ids=str)
def test_no_rule_reaches_secrets_deletes_or_escalates(values: tuple[str, ...]) -> None:
    deletes = set()
    for role in (o for o in render(*values) if o["kind"] in ("Role", "ClusterRole")):
        for group, resource, verbs in rbac.flatten(role["rules"]):
            assert "*" not in (group, resource) and "*" not in verbs
            assert resource not in ("secrets", "serviceaccounts/token", "pods/exec", "nodes")
            assert not verbs & {"deletecollection", "update", "escalate", "bind", "impersonate"}, resource
            if "delete" in verbs:
                deletes.add((group, resource))
    # Obsolete build Jobs are the one thing the operator deletes; a delete anywhere else fails here.
    assert deletes == rbac.DELETABLE


def test_namespaced_install_keeps_writes_in_the_watched_namespaces() -> None:
    objects = render("namespaced")
    cluster_role = find(objects, "ClusterRole", "tailtune")
    assert rbac.flatten(cluster_role["rules"]) == [rbac.NAMESPACES, rbac.CRDS]
    expected = sorted([rbac.PEERINGS, *rbac.NAMESPACED], key=lambda e: (e[0], e[1]))
    for ns in ("team-a", "team-b"):
        assert rbac.flatten(find(objects, "Role", "tailtune", ns)["rules"]) == expected
        binding = find(objects, "RoleBinding", "tailtune", ns)
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tailtune", "namespace": NAMESPACE}]
        assert find(objects, "KopfPeering", "tailtune", ns)
    assert not [o for o in objects if o["kind"] == "ClusterKopfPeering"]
    args = container(objects)["args"]
    assert args[-2:] == ["--namespace=team-a", "--namespace=team-b"]


def test_rbac_and_service_account_can_be_brought() -> None:
    objects = render(sets=("rbac.create=false", "serviceAccount.create=false", "serviceAccount.name=ops"))
    assert not {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} & set(kinds(objects))
    assert find(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "ops"
    result = template(sets=("serviceAccount.create=false",))
    assert result.returncode != 0
    assert "serviceAccount.name is required when serviceAccount.create is false" in result.stderr


# -------------------------------------------------------------------------------------- HA, monitoring


def test_ha_values() -> None:
    objects = render("ha")
    deployment = find(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["template"]["spec"]["priorityClassName"] == "system-cluster-critical"
    assert find(objects, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    assert container(objects)["resources"]["limits"] == {"memory": "768Mi"}


def test_a_shard_is_passed_to_the_operator_with_its_own_peering() -> None:
    """Caught: the chart had no way to run one release per shard (`tailtune operator --shard`)."""
    objects = render(sets=("shard=tailtune.io/shard!=a", "peering.name=tailtune-rest"))
    assert container(objects)["args"][-1] == "--shard=tailtune.io/shard!=a"
    assert find(objects, "ClusterKopfPeering")["metadata"]["name"] == "tailtune-rest"
    assert not any(a.startswith("--shard") for a in container(render())["args"])


def test_single_replica_can_still_be_drained() -> None:
    objects = render(sets=("replicaCount=1",))
    assert find(objects, "Deployment")["spec"]["replicas"] == 1
    assert find(objects, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("values", [(), ("ha",), ("namespaced",)], ids=str)
def test_no_monitoring_objects_unless_enabled(values: tuple[str, ...]) -> None:
    assert not {"ServiceMonitor", "PodMonitor", "NetworkPolicy"} & set(kinds(render(*values)))


def test_monitoring_values() -> None:
    objects = render("monitoring")
    monitor = find(objects, "ServiceMonitor", "tailtune")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"] == {"matchLabels": SELECTOR}
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    # honorLabels: the InferenceService's `namespace` label must survive the target's own.
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "honorLabels": True, "interval": "15s"}
    ]
    triton = find(objects, "PodMonitor", "tailtune-triton")
    assert triton["spec"]["selector"]["matchLabels"].items() <= TRITON_POD_LABELS.items()
    assert triton["spec"]["namespaceSelector"] == {"any": True}
    (endpoint,) = triton["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"
    assert {
        "sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
        "targetLabel": "inferenceservice",
    } in endpoint["relabelings"]
    dashboard = find(objects, "ConfigMap", "tailtune-dashboard")
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    policy = find(objects, "NetworkPolicy", "tailtune")
    assert policy["spec"]["podSelector"] == {"matchLabels": SELECTOR}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [
        {
            "ports": [{"port": "metrics", "protocol": "TCP"}],
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        }
    ]


def test_operator_pod_monitor_instead_of_service_monitor() -> None:
    objects = render(sets=("metrics.podMonitor.enabled=true",))
    monitor = find(objects, "PodMonitor", "tailtune")
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert "ServiceMonitor" not in kinds(objects)


def test_both_operator_monitors_is_an_error() -> None:
    result = template(sets=("metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true"))
    assert result.returncode != 0
    assert "both scrape the operator: enable one" in result.stderr


def test_restricted_egress_keeps_dns() -> None:
    rule = "networkPolicy.egress[0].to[0].ipBlock.cidr=10.0.0.1/32"
    policy = find(render(sets=("networkPolicy.enabled=true", rule)), "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    dns, api = policy["spec"]["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert api == {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}]}


# -------------------------------------------------------------------------------------- engine store


def test_engine_store_claim_by_default() -> None:
    """The claim the API defaults spec.engine.store.pvc to, where the InferenceServices are: else builds never start."""
    default_claim = InferenceServiceSpec.model_fields["engine"].default.store.pvc
    pvc = find(render(), "PersistentVolumeClaim")
    assert pvc["metadata"]["name"] == default_claim == "tailtune-engines"
    assert pvc["metadata"]["namespace"] == NAMESPACE
    assert pvc["metadata"]["labels"]["app.kubernetes.io/component"] == "engine-store"
    assert pvc["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert pvc["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "50Gi"}}}


def test_engine_store_class_size_mode_and_namespaces() -> None:
    sets = (
        "engineStore.storageClassName=efs-sc",
        "engineStore.size=200Gi",
        "engineStore.accessModes={ReadWriteOnce}",
        "engineStore.keepOnUninstall=false",
    )
    objects = render("namespaced", sets=sets)
    for ns in ("team-a", "team-b"):
        pvc = find(objects, "PersistentVolumeClaim", "tailtune-engines", ns)
        assert "annotations" not in pvc["metadata"]
        assert pvc["spec"] == {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "efs-sc",
            "resources": {"requests": {"storage": "200Gi"}},
        }
    chosen = render(sets=("engineStore.namespaces={ml,ml-staging}", "engineStore.name=engines"))
    claims = [
        (o["metadata"]["namespace"], o["metadata"]["name"]) for o in chosen if o["kind"] == "PersistentVolumeClaim"
    ]
    assert claims == [("ml", "engines"), ("ml-staging", "engines")]


@pytest.mark.parametrize("assignment", ["engineStore.create=false", "engineStore.existingClaim=model-cache"])
def test_engine_store_can_be_brought(assignment: str) -> None:
    assert "PersistentVolumeClaim" not in kinds(render(sets=(assignment,)))


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("engineStore.accessModes={ReadWriteSometimes}", "/engineStore/accessModes/0"),
        ("engineStore.size=lots", "/engineStore/size"),
        ("engineStore.existingClaim=Model_Cache", "/engineStore/existingClaim"),
        ("engineStore.storage=1Gi", "storage"),
    ],
)
def test_engine_store_schema(assignment: str, message: str) -> None:
    result = template(sets=(assignment,))
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_notes_say_what_was_created(tmp_path: Path) -> None:
    text = notes(tmp=tmp_path)
    assert (
        'created PersistentVolumeClaim "tailtune-engines" (50Gi, ReadWriteMany, storage class (cluster default))'
        in text
    )
    assert f"in {NAMESPACE}. helm uninstall keeps it." in text
    assert f"kubectl get pvc tailtune-engines --namespace {NAMESPACE}" in text
    assert f"kubectl apply --namespace {NAMESPACE} -f examples/resnet-l4.yaml" in text
    # The default Prometheus URL, as the API defaults it.
    default_url = InferenceServiceSpec.model_fields["metrics"].default.prometheus_url
    assert default_url in text


def test_notes_for_a_brought_claim(tmp_path: Path) -> None:
    text = notes(sets=("engineStore.existingClaim=model-cache",), tmp=tmp_path / "existing")
    assert 'uses your claim "model-cache"; the chart created none' in text
    assert "spec.engine.store.pvc: model-cache" in text
    off = notes(sets=("engineStore.create=false",), tmp=tmp_path / "off")
    assert 'none created (engineStore.create=false): create PersistentVolumeClaim "tailtune-engines"' in off
    spread = notes("namespaced", tmp=tmp_path / "namespaced")
    assert "in team-a, team-b." in spread
    assert "kubectl apply --namespace team-a -f examples/resnet-l4.yaml" in spread


def test_readme_install_command_renders_the_engine_store_it_describes() -> None:
    """The `helm install` of README "On a real cluster", with its --set flags, as written."""
    readme = (REPO / "README.md").read_text()
    command = re.search(r"^helm install tailtune charts/tailtune (.*?)\n(?!  )", readme, re.M | re.S)
    assert command, "no helm install in README.md"
    sets = tuple(s.strip("'") for s in re.findall(r"--set (\S+)", command.group(1)))
    objects = render(sets=sets)
    pvc = find(objects, "PersistentVolumeClaim", "tailtune-engines", "ml")
    assert pvc["spec"]["storageClassName"] == "efs-sc"
    assert find(objects, "PodMonitor", "tailtune-triton")


# ----------------------------------------------------------------------------------------- dashboard


def dashboard_json() -> dict[str, Any]:
    text = find(render(), "ConfigMap", "tailtune-dashboard")["data"]["tailtune.json"]
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def exported_names() -> set[str]:
    """Every series name the operator's metrics module exports."""
    names: set[str] = set()
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            (family,) = metric.describe()
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
            names |= {family.name + s for s in suffixes[family.type]}
    return names


def test_dashboard_panels() -> None:
    board = dashboard_json()
    titles = {p["title"] for p in board["panels"]}
    assert {"P99 vs SLO", "Throughput", "Batch size", "Queue delay", "Config changes", "Replicas"} <= titles
    (per_service,) = [p for p in board["panels"] if p["type"] == "row" and p.get("repeat")]
    assert per_service["repeat"] == "inferenceservice"
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource", "namespace", "inferenceservice"]


def test_dashboard_queries_only_metrics_that_exist() -> None:
    board = dashboard_json()
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in board["annotations"]["list"]]
    exprs += [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    ours = {name for e in exprs for name in re.findall(r"\btailtune_[a-z0-9_]+", e)}
    assert ours and ours <= exported_names(), ours - exported_names()
    triton = {name for e in exprs for name in re.findall(r"\bnv_inference_[a-z_]+", e)}
    assert triton == {
        "nv_inference_request_summary_us",
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_queue_duration_us",
    }


# --------------------------------------------------------------------------------------------- schema


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("replicaCount=two", "/replicaCount"),
        ("replicaCount=0", "/replicaCount"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("replicas=2", "replicas"),
        ("watchNamespaces[0]=Team_A", "/watchNamespaces/0"),
        ("metrics.port=70000", "/metrics/port"),
        ("metrics.serviceMonitor.interval=soon", "/metrics/serviceMonitor/interval"),
        ("resources.requests.cpu=lots", "/resources/requests/cpu"),
    ],
)
def test_schema_rejects_bad_values(assignment: str, message: str) -> None:
    result = template(sets=(assignment,))
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert message in result.stderr, result.stderr


def test_schema_names_what_is_wrong() -> None:
    """A platform engineer reads the error, not the schema: it says what was expected."""
    pull = template(sets=("image.pullPolicy=Sometimes",)).stderr
    assert "IfNotPresent" in pull, pull
    typo = template(sets=("replicas=2",)).stderr
    assert "additional properties" in typo.lower() and "'replicas'" in typo, typo
    kind = template(sets=("replicaCount=two",)).stderr
    assert "integer" in kind, kind


# ----------------------------------------------------------------------------------------------- CRDs


def test_chart_crd_is_the_generated_one() -> None:
    for path in (REPO / "crds").glob("*.yaml"):
        assert (CHART / "crds" / path.name).read_bytes() == path.read_bytes(), f"cp {path} {CHART / 'crds'}"


def test_chart_ships_the_crds_it_needs() -> None:
    result = template(crds=True)
    assert result.returncode == 0, result.stderr
    crds = {
        d["metadata"]["name"]: d["spec"]
        for d in yaml.safe_load_all(result.stdout)
        if d and d["kind"] == "CustomResourceDefinition"
    }
    assert set(crds) == {
        "inferenceservices.tailtune.io",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    }
    for name, scope, kind in (
        ("clusterkopfpeerings.kopf.dev", "Cluster", "ClusterKopfPeering"),
        ("kopfpeerings.kopf.dev", "Namespaced", "KopfPeering"),
    ):
        spec = crds[name]
        assert (spec["group"], spec["scope"], spec["names"]["kind"]) == ("kopf.dev", scope, kind)
        (version,) = spec["versions"]
        assert version["name"] == "v1" and version["served"] and version["storage"]
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        assert status == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}

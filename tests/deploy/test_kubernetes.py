"""deploy/kubernetes, checked offline: every overlay renders with kustomize, every object
validates strictly against the Kubernetes API schemas (a CloudNativePG Cluster against
the part of its schema kept beside this test), and the rendered manifests keep
the properties the gateway depends on (timeouts that nest, real probe paths, settings
the gateway reads, a locked-down pod, room for disruptions)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gateway.http.routes import ENDPOINTS, ROUTES
from gateway.metrics import Metrics
from gateway.settings import ENV_NAMES, Settings
from tests.support.ci import unavailable

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("dev", "prod", "ha")
# Kinds of operators the cluster must run, validated against schemas kept here, not
# the Kubernetes API's (kubernetes_validate knows only the core kinds).
CNPG_CLUSTER = "postgresql.cnpg.io/v1"
CNPG_SCHEMA = Path(__file__).with_name("cnpg-cluster.schema.yaml")
# The oldest API the manifests need (the preStop sleep action), and a recent one.
SCHEMA_VERSIONS = ("1.30.0", "1.34.0")
SECRET_NAMES = {"DATABASE_URL", "REDIS_URL", "GATEWAY_ADMIN_TOKEN"}
API_PORT = 8080

Obj = dict[str, Any]


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        unavailable(
            "kubectl is not installed (it renders deploy/kubernetes)",
            "CI must check deploy/kubernetes",
        )
    return found


_rendered: dict[str, list[Obj]] = {}


def render(name: str) -> list[Obj]:
    if name not in _rendered:
        directory = KUSTOMIZE / ("base" if name == "base" else f"overlays/{name}")
        done = subprocess.run(
            [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        _rendered[name] = [o for o in yaml.safe_load_all(done.stdout) if o]
    return _rendered[name]


def one(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} {kind} objects named {name}"
    return found[0]


def pod_specs(objects: list[Obj]) -> list[tuple[str, Obj]]:
    return [
        (f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["spec"])
        for o in objects
        if o["kind"] in ("Deployment", "Job")
    ]


def server(objects: list[Obj]) -> Obj:
    container: Obj = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return container


def config(objects: list[Obj]) -> dict[str, str]:
    data: dict[str, str] = one(objects, "ConfigMap")["data"]
    return data


def settings_of(objects: list[Obj]) -> Settings:
    """The settings the server would start with (the Secret's values are stand-ins)."""
    env = {**config(objects), "GATEWAY_ADMIN_TOKEN": "x" * 32}
    return Settings.from_env(env)


def matches(selector: Obj, labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


all_renders = pytest.mark.parametrize("name", ["base", *OVERLAYS])
overlays = pytest.mark.parametrize("name", OVERLAYS)


@all_renders
def test_renders(name: str) -> None:
    kinds = {o["kind"] for o in render(name)}
    assert {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "ConfigMap",
        "NetworkPolicy",
        "Job",
        "ServiceAccount",
    } <= kinds


@all_renders
@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_validates_strictly(name: str, version: str) -> None:
    for obj in render(name):
        if obj["apiVersion"] != CNPG_CLUSTER:
            kubernetes_validate.validate(obj, version, strict=True)


def test_strict_validation_refuses_an_unknown_field() -> None:
    # The check above would be worth nothing if a misspelt field passed.
    deployment = dict(one(render("base"), "Deployment"))
    deployment["spec"] = {**deployment["spec"], "replica": 3}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, SCHEMA_VERSIONS[0], strict=True)


@overlays
def test_grace_period_outlasts_prestop_max_wait_and_drain(name: str) -> None:
    objects = render(name)
    spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    settings = settings_of(objects)
    pre_stop = server(objects)["lifecycle"]["preStop"]["sleep"]["seconds"]
    needed = pre_stop + settings.max_wait_seconds + settings.shutdown_grace_seconds
    assert spec["terminationGracePeriodSeconds"] > needed


@overlays
def test_probes_are_public_get_routes_of_the_app(name: str) -> None:
    # The app's own route table, and of it what answers without a token.
    routed_gets = {r.path for r in ROUTES if "GET" in (r.methods or ())}
    public_gets = {e.path for e in ENDPOINTS if e.scope is None} & routed_gets
    container = server(render(name))
    port_names = {p["name"] for p in container["ports"]}
    paths = {}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] in public_gets, (probe, get["path"])
        assert get["port"] in port_names
        paths[probe] = get["path"]
    assert paths["readinessProbe"] == "/readyz"
    assert paths["livenessProbe"] == "/healthz"


@overlays
def test_server_keeps_idle_connections_longer_than_common_proxies(name: str) -> None:
    # A server that closes an idle connection first makes the proxy answer 502 at times.
    # ingress-nginx keeps idle upstream connections 60 s; a load balancer with one idle
    # timeout for both sides (AWS ALB) needs it above the longest poll, and so do we.
    objects = render(name)
    args = server(objects)["args"]
    assert args[0] == "serve"
    keep_alive = int(args[args.index("--keep-alive-seconds") + 1])
    assert keep_alive > 60
    assert keep_alive > settings_of(objects).max_wait_seconds + 10
    assert args[args.index("--host") + 1] == "0.0.0.0"
    assert [int(args[args.index("--port") + 1])] == [
        p["containerPort"] for p in server(objects)["ports"]
    ]


@all_renders
def test_pods_run_locked_down(name: str) -> None:
    for where, spec in pod_specs(render(name)):
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True, where
        assert pod["runAsUser"] > 0, where
        assert pod["seccompProfile"]["type"] == "RuntimeDefault", where
        assert spec["automountServiceAccountToken"] is False, where
        mounts_of_emptydirs = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
        for container in spec["containers"]:
            sc = container["securityContext"]
            assert sc["runAsNonRoot"] is True, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert "add" not in sc["capabilities"], where
            # With a read-only root, /tmp is an emptyDir.
            tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert tmp and tmp[0]["name"] in mounts_of_emptydirs, where
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), where
            assert {"cpu", "memory"} <= set(resources["limits"]), where


@all_renders
def test_configmap_holds_only_settings_the_gateway_reads(name: str) -> None:
    objects = render(name)
    keys = set(config(objects))
    assert keys <= ENV_NAMES, keys - ENV_NAMES
    assert not keys & SECRET_NAMES, "secrets belong in a Secret"
    assert settings_of(objects).auth_enabled  # and the values pass the gateway's checks


@all_renders
def test_secrets_are_references_only(name: str) -> None:
    objects = render(name)
    assert not [o for o in objects if o["kind"] == "Secret"]
    for where, spec in pod_specs(objects):
        for container in spec["containers"]:
            for var in container.get("env", []):
                assert var["name"] in ENV_NAMES, (where, var["name"])
                if var["name"] in SECRET_NAMES:
                    assert "value" not in var and "secretKeyRef" in var["valueFrom"], where
    names = {v["name"] for v in server(objects)["env"]}
    assert names == SECRET_NAMES


@all_renders
def test_rollout_never_goes_below_the_current_count(name: str) -> None:
    deployment = one(render(name), "Deployment")
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    # The autoscaler owns the count; an apply must not reset it.
    assert "replicas" not in deployment["spec"]


@all_renders
def test_pods_spread_over_zones_and_nodes(name: str) -> None:
    deployment = one(render(name), "Deployment")
    template = deployment["spec"]["template"]
    constraints = template["spec"]["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in constraints} == {
        "topology.kubernetes.io/zone",
        "kubernetes.io/hostname",
    }
    for c in constraints:
        assert matches(c["labelSelector"], template["metadata"]["labels"])


@all_renders
def test_service_pdb_and_hpa_point_at_the_server(name: str) -> None:
    objects = render(name)
    deployment = one(objects, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = one(objects, "Service")
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    assert matches(one(objects, "PodDisruptionBudget")["spec"]["selector"], labels)
    target = one(objects, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    # The migration Job's pods are no part of the server's.
    job = one(objects, "Job")
    job_labels = job["spec"]["template"]["metadata"]["labels"]
    assert not all(job_labels.get(k) == v for k, v in service["spec"]["selector"].items())


def test_base_autoscaler_needs_no_custom_metrics() -> None:
    hpa = one(render("base"), "HorizontalPodAutoscaler")
    assert {m["type"] for m in hpa["spec"]["metrics"]} == {"Resource"}


def test_prod_scales_on_a_metric_the_gateway_exports() -> None:
    hpa = one(render("prod"), "HorizontalPodAutoscaler")
    names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert names == ["gateway_parked_polls"]
    exported = Metrics().render()[0].decode()
    assert "\ngateway_parked_polls " in exported
    (pods,) = [m["pods"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert int(pods["target"]["averageValue"]) < settings_of(render("prod")).max_parked_polls


def test_prod_runs_three_pods_or_more_with_a_budget() -> None:
    objects = render("prod")
    hpa = one(objects, "HorizontalPodAutoscaler")["spec"]
    assert hpa["minReplicas"] >= 3
    pdb = one(objects, "PodDisruptionBudget")["spec"]
    if "maxUnavailable" in pdb:
        assert pdb["maxUnavailable"] == 1
    else:
        assert 1 <= pdb["minAvailable"] < hpa["minReplicas"]
    # Pods x pool fits a stock Postgres (max_connections 300 here) with the surge.
    assert hpa["maxReplicas"] * 1.25 * settings_of(objects).db_pool_max <= 300


@all_renders
def test_network_policy_opens_only_the_api_port(name: str) -> None:
    objects = render(name)
    policy = one(objects, "NetworkPolicy")["spec"]
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    for o in objects:
        if o["kind"] in ("Deployment", "Job"):
            assert matches(policy["podSelector"], o["spec"]["template"]["metadata"]["labels"])
    assert [p["containerPort"] for p in server(objects)["ports"]] == [API_PORT]
    assert policy["ingress"], "no ingress rule: nothing could reach the API"
    for rule in policy["ingress"]:
        assert rule["ports"] == [{"port": API_PORT, "protocol": "TCP"}]
    egress_ports = {(p["port"], p["protocol"]) for r in policy["egress"] for p in r["ports"]}
    assert egress_ports == {(53, "UDP"), (53, "TCP"), (5432, "TCP"), (6379, "TCP")}


@all_renders
def test_migration_job_runs_migrate_with_the_server_image(name: str) -> None:
    objects = render(name)
    job = one(objects, "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["migrate"]
    assert container["image"] == server(objects)["image"]
    assert not container["image"].endswith(":latest") and ":" in container["image"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def cnpg_schema() -> Obj:
    schema: Obj = yaml.safe_load(CNPG_SCHEMA.read_text())
    return schema


def test_the_ha_postgres_cluster_validates_and_a_misspelt_field_does_not() -> None:
    cluster = one(render("ha"), "Cluster")
    jsonschema.validate(cluster, cnpg_schema())
    misspelt = {**cluster, "spec": {**cluster["spec"], "instance": 3}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(misspelt, cnpg_schema())


def test_the_ha_overlay_reaches_the_primary_and_loses_no_acknowledged_commit() -> None:
    """Three instances, each commit acknowledged by a synchronous standby too (a
    failover then loses no acknowledged enqueue), and the gateway and its migration
    reaching the primary through the operator's `-rw` Service, whose URL is in the
    Secret the operator makes for the application's owner."""
    objects = render("ha")
    cluster = one(objects, "Cluster")
    assert cluster["spec"]["instances"] >= 3
    sync = cluster["spec"]["postgresql"]["synchronous"]
    assert sync["number"] >= 1 and sync.get("dataDurability", "required") == "required"
    secret = f"{cluster['metadata']['name']}-app"
    for where, spec in pod_specs(objects):
        [url] = [v for v in spec["containers"][0]["env"] if v["name"] == "DATABASE_URL"]
        assert url["valueFrom"]["secretKeyRef"] == {"name": secret, "key": "uri"}, where
    # The Cluster's pods are not the gateway's: no selector of the gateway's picks them.
    assert "app.kubernetes.io/name" not in (cluster["metadata"].get("labels") or {})
    assert cluster["metadata"]["namespace"] == one(objects, "Deployment")["metadata"]["namespace"]

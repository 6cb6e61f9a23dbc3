"""The Helm chart in helm/bridge, linted and rendered by the real Helm engine.

helm-python-sdk (a dev dependency) binds Helm v4's Go SDK as a library, so no `helm` binary or
cluster is needed. Without it this module fails to import, and the run fails: it never skips.
Each render costs a few milliseconds; the module renders a handful of value sets, once each.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from bridge.config.loader import parse_config
from bridge.config.models import (
    Endpoint,
    HeaderRules,
    HttpConfig,
    KafkaConnection,
    PostgresConnection,
    Proxies,
    RabbitMQConnection,
    RegisteredEndpoint,
    Route,
    SqliteConnection,
    SqlServerConnection,
)

CHART = Path(__file__).resolve().parents[2] / "helm" / "bridge"
RELEASE = "shop"
FULLNAME = "shop-bridge"

Manifests = dict[str, list[dict[str, Any]]]


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: helm.Chart, values: dict[str, Any] | None = None) -> Manifests:
    """Every rendered object, parsed, by kind."""
    rendered = chart.render(values, name=RELEASE, namespace="bridge")
    out: Manifests = {}
    for path, text in rendered.items():
        if path.endswith("NOTES.txt"):
            assert text.strip(), "NOTES.txt rendered empty"
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                out.setdefault(doc["kind"], []).append(doc)
    return out


def one(manifests: Manifests, kind: str) -> dict[str, Any]:
    objects = manifests.get(kind, [])
    assert len(objects) == 1, f"expected one {kind}, got {len(objects)}"
    return objects[0]


def container(manifests: Manifests) -> dict[str, Any]:
    containers = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def routes_yaml(manifests: Manifests) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(one(manifests, "ConfigMap")["data"]["routes.yaml"])
    return loaded


def pod_annotations(manifests: Manifests) -> dict[str, str]:
    annotations: dict[str, str] = one(manifests, "Deployment")["spec"]["template"]["metadata"][
        "annotations"
    ]
    return annotations


MY_ROUTES: dict[str, Any] = {
    "http": {"port": 9090},
    "connections": {
        "legacy": {"type": "sqlserver", "dsn": "${LEGACY_ODBC}", "catalog": "nservicebus"},
        "rabbit": {"type": "rabbitmq", "url": "${RABBIT_URL}", "prefetch": "${PREFETCH:-500}"},
    },
    "routes": [
        {
            "name": "shipping-to-rabbit",
            "from": {"connection": "legacy", "queue": "Shipping"},
            "to": {"connection": "rabbit", "queue": "Shipping"},
            "batch_size": 500,
        }
    ],
}

# Everything optional switched on, with the user's own routes and a Secret made by the chart.
FULL: dict[str, Any] = {
    "routes": MY_ROUTES,
    "secret": {"values": {"LEGACY_ODBC": "Driver=FreeTDS;Server=db", "RABBIT_URL": "amqp://r"}},
    "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prometheus"}},
    "podDisruptionBudget": {"minAvailable": 1},
    "serviceAccount": {"create": True},
    "env": [{"name": "OTEL_SERVICE_NAME", "value": "bridge"}],
    "extraArgs": ["--route", "shipping-to-rabbit"],
}


@pytest.fixture(scope="module")
def default(chart: helm.Chart) -> Manifests:
    return render(chart)


@pytest.fixture(scope="module")
def full(chart: helm.Chart) -> Manifests:
    return render(chart, FULL)


def lint_problems(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Lint findings worse than informational (severity 2 warning, 3 error)."""
    report = helm.lint(CHART, values, strict=True, namespace="bridge")
    assert report["total_charts_linted"] == 1
    return [m for m in report["messages"] if m["severity"] >= 2] + [
        {"error": e} for e in report["errors"]
    ]


@pytest.mark.parametrize("values", [None, FULL], ids=["defaults", "everything-on"])
def test_chart_lints_clean(values: dict[str, Any] | None) -> None:
    assert lint_problems(values) == []


def test_lint_reports_a_values_typo() -> None:
    problems = lint_problems({"replicas": 2})
    assert any("replicas" in p["error"] for p in problems)


def test_default_values_render_the_expected_objects(default: Manifests) -> None:
    assert sorted(default) == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service"]
    deployment = one(default, "Deployment")
    assert deployment["metadata"]["name"] == FULLNAME
    labels = deployment["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "bridge"
    assert labels["app.kubernetes.io/instance"] == RELEASE
    assert labels["app.kubernetes.io/version"] == "0.1.0"
    assert labels["helm.sh/chart"] == "bridge-0.1.0"
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert one(default, "Service")["spec"]["selector"] == selector
    assert one(default, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == selector


def test_container_runs_the_routes_from_the_configmap(default: Manifests) -> None:
    deployment = one(default, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    main = container(default)
    assert deployment["spec"]["replicas"] == 1
    assert main["image"] == "bridge:0.1.0"
    assert main["imagePullPolicy"] == "IfNotPresent"
    assert main["args"] == ["run", "-c", "/etc/bridge/routes.yaml"]
    mounts = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/etc/bridge"]]["configMap"]["name"] == FULLNAME
    assert volumes[mounts["/tmp"]]["emptyDir"] == {}
    assert pod["terminationGracePeriodSeconds"] == 60
    assert pod["automountServiceAccountToken"] is False
    assert "envFrom" not in main  # the defaults make no Secret and name none


def test_workers_run_as_bridge_run_workers(chart: helm.Chart) -> None:
    args = container(render(chart, {"workers": 2}))["args"]
    assert args == ["run", "-c", "/etc/bridge/routes.yaml", "--workers", "2"]


def test_probes_hit_healthz_and_readyz_on_the_http_port(default: Manifests) -> None:
    main = container(default)
    assert main["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert routes_yaml(default)["http"] == {"host": "0.0.0.0", "port": 8080}
    service = one(default, "Service")["spec"]
    assert service["type"] == "ClusterIP"
    assert service["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}
    ]


def test_pod_is_locked_down(default: Manifests) -> None:
    pod = one(default, "Deployment")["spec"]["template"]["spec"]["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] == 10001
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(default)["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == 10001
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_resources_have_requests_and_a_memory_limit(default: Manifests) -> None:
    resources = container(default)["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"]
    assert resources["limits"]["memory"]


def test_configmap_is_the_routes_value_bound_to_all_interfaces(
    chart: helm.Chart, default: Manifests
) -> None:
    expected = copy.deepcopy(chart.values["routes"])
    expected["http"] = {"host": "0.0.0.0", "port": 8080}
    rendered = routes_yaml(default)
    assert rendered == expected
    # ... and the bridge's own loader accepts it once the Secret's variable is there.
    text = one(default, "ConfigMap")["data"]["routes.yaml"]
    loaded = parse_config(text, "routes.yaml", env={"SHOP_DSN": "postgresql://u@db/shop"})
    assert loaded.variables == {"SHOP_DSN"}
    assert loaded.config.http == HttpConfig(host="0.0.0.0", port=8080)


def test_own_routes_replace_the_example(full: Manifests) -> None:
    # Helm merges the user's `connections` map into the example's; the chart keeps only the
    # connections the user's routes use, so the example's (and its ${SHOP_DSN}) stay out.
    expected = copy.deepcopy(MY_ROUTES)
    expected["http"] = {"host": "0.0.0.0", "port": 9090}
    assert routes_yaml(full) == expected
    main = container(full)
    assert main["ports"][0]["containerPort"] == 9090
    assert one(full, "Service")["spec"]["ports"][0]["port"] == 9090
    assert main["args"] == ["run", "-c", "/etc/bridge/routes.yaml", "--route", "shipping-to-rabbit"]
    assert main["env"] == [{"name": "OTEL_SERVICE_NAME", "value": "bridge"}]


def test_a_route_to_an_undefined_connection_fails_the_render(chart: helm.Chart) -> None:
    routes = copy.deepcopy(MY_ROUTES)
    routes["routes"][0]["to"]["connection"] = "rabit"
    with pytest.raises(helm.HelmRenderError, match=r'names connection "rabit"'):
        chart.render({"routes": routes}, name=RELEASE)


def test_pods_roll_when_routes_change(default: Manifests, full: Manifests) -> None:
    before, after = pod_annotations(default), pod_annotations(full)
    assert len(before["checksum/routes"]) == 64
    assert before["checksum/routes"] != after["checksum/routes"]
    assert "checksum/secret" not in before
    assert len(after["checksum/secret"]) == 64


def test_chart_made_secret_is_loaded_with_envfrom(full: Manifests) -> None:
    secret = one(full, "Secret")
    assert secret["metadata"]["name"] == FULLNAME
    decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert decoded == FULL["secret"]["values"]
    assert container(full)["envFrom"] == [{"secretRef": {"name": FULLNAME}}]


def test_existing_secret_is_used_and_none_is_made(chart: helm.Chart) -> None:
    values = {"secret": {"existingSecret": "shop-credentials", "values": {"SHOP_DSN": "x"}}}
    manifests = render(chart, values)
    assert "Secret" not in manifests
    assert container(manifests)["envFrom"] == [{"secretRef": {"name": "shop-credentials"}}]
    assert "checksum/secret" not in pod_annotations(manifests)


def test_servicemonitor_only_when_enabled(default: Manifests, full: Manifests) -> None:
    assert "ServiceMonitor" not in default
    monitor = one(full, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"] == one(full, "Service")["spec"]["selector"]
    assert monitor["spec"]["endpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
    ]


def test_pdb_allows_one_pod_down_unless_min_available_is_set(
    default: Manifests, full: Manifests
) -> None:
    pdb = one(default, "PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in pdb["spec"]
    spec = one(full, "PodDisruptionBudget")["spec"]
    assert spec["minAvailable"] == 1
    assert "maxUnavailable" not in spec


def test_created_service_account_is_used(full: Manifests) -> None:
    account = one(full, "ServiceAccount")
    pod = one(full, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"] == FULLNAME


TYPOS = [
    {"replicas": 2},
    {"workers": 0},
    {"image": {"tg": "1.0"}},
    {"resources": {"request": {"cpu": "1"}}},
    {"secret": {"existingsecret": "x"}},
    {"serviceMonitor": {"enable": True}},
    {"routes": {"connections": {"k": {"type": "kafka", "bootstrap_server": "k:9092"}}}},
    {"routes": {"connections": {"k": {"type": "kafak", "bootstrap_servers": "k:9092"}}}},
    {"routes": {"routes": [{"name": "r", "from": {"connection": "a"}, "too": {}}]}},
    {"secret": {"values": {"NOT-A-VAR": "x"}}},
]


@pytest.mark.parametrize("typo", TYPOS, ids=lambda v: json.dumps(v)[:60])
def test_values_typos_fail_schema_validation(chart: helm.Chart, typo: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(chart.merge_values(typo))


def test_render_refuses_values_the_schema_rejects(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmValuesError, match="replicas"):
        chart.render({"replicas": 2}, name=RELEASE)


def test_var_references_pass_the_schema_where_numbers_go(chart: helm.Chart) -> None:
    # The bridge expands ${VAR} inside strings before validating, so "${N:-3}" is a fine integer.
    routes = copy.deepcopy(MY_ROUTES)
    routes["routes"][0]["batch_size"] = "${BATCH:-100}"
    chart.validate_schema(chart.merge_values({"routes": routes}))


CONNECTION_MODELS = {
    "sqliteConnection": SqliteConnection,
    "postgresqlConnection": PostgresConnection,
    "sqlserverConnection": SqlServerConnection,
    "kafkaConnection": KafkaConnection,
    "rabbitmqConnection": RabbitMQConnection,
    "endpoint": Endpoint,
    "registeredEndpoint": RegisteredEndpoint,
    "proxies": Proxies,
    "route": Route,
    "headerRules": HeaderRules,
}


@pytest.mark.parametrize("definition", sorted(CONNECTION_MODELS))
def test_schema_knows_the_same_routes_keys_as_the_config_models(definition: str) -> None:
    # The schema mirrors bridge/config/models.py by hand; a new field there must land here too.
    schema = json.loads((CHART / "values.schema.json").read_text())
    model = CONNECTION_MODELS[definition]
    keys = {field.alias or name for name, field in model.model_fields.items()}
    assert set(schema["definitions"][definition]["properties"]) == keys
    http = schema["properties"]["routes"]["properties"]["http"]["properties"]
    assert set(http) == set(HttpConfig.model_fields)


REGISTRY: dict[str, Any] = {
    "connections": MY_ROUTES["connections"],
    "routes": [],
    "endpoints": {
        "Sales": {"connection": "legacy"},
        "Billing": {"connection": "rabbit", "concurrency": "${BILLING_LOOPS:-2}"},
    },
    "proxies": {"create": True},
}


def test_a_registry_alone_renders_with_its_connections_and_passes_check(
    chart: helm.Chart,
) -> None:
    rendered = routes_yaml(render(chart, {"routes": REGISTRY}))
    # The example's connection stays out; "every connection" is written out as the ones used.
    assert set(rendered["connections"]) == {"legacy", "rabbit"}
    assert rendered["routes"] == []
    assert rendered["proxies"] == {"create": True, "connections": ["legacy", "rabbit"]}
    env = {"LEGACY_ODBC": "Driver=x", "RABBIT_URL": "amqp://r/"}
    config = parse_config(yaml.safe_dump(rendered), env=env).config
    assert sorted(r.name for r in config.all_routes) == [
        "proxy.legacy.Billing",
        "proxy.rabbit.Sales",
    ]


def test_an_endpoint_on_an_undefined_connection_fails_the_render(chart: helm.Chart) -> None:
    registry = copy.deepcopy(REGISTRY)
    registry["endpoints"]["Sales"]["connection"] = "legacyy"
    with pytest.raises(helm.HelmRenderError, match=r'endpoint "Sales" names connection "legacyy"'):
        chart.render({"routes": registry}, name=RELEASE)


def test_registry_typos_fail_schema_validation(chart: helm.Chart) -> None:
    for typo in (
        {"endpoints": {"Sales": {"conection": "legacy"}}},
        {"proxies": {"crate": True}},
    ):
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema(chart.merge_values({"routes": {**REGISTRY, **typo}}))

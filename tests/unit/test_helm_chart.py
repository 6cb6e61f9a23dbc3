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
    EventConfig,
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
    Subscription,
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


#: The least a user gives: a value for the example's ${SHOP_DSN} (here from their own Secret).
DEFAULTS: dict[str, Any] = {
    "env": [{"name": "SHOP_DSN", "valueFrom": {"secretKeyRef": {"name": "shop-db", "key": "dsn"}}}]
}


@pytest.fixture(scope="module")
def default(chart: helm.Chart) -> Manifests:
    return render(chart, DEFAULTS)


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


#: The Jobs switched on, the check with --connect, four workers.
JOBS: dict[str, Any] = {
    **FULL,
    "workers": 4,
    "check": {"connect": True},
    "install": {"enabled": True},
    "migrate": {"enabled": True, "route": "shipping-to-rabbit"},
}


@pytest.mark.parametrize(
    "values", [DEFAULTS, FULL, JOBS], ids=["defaults", "everything-on", "jobs"]
)
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
    args = container(render(chart, {**DEFAULTS, "workers": 2}))["args"]
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
    "subscription": Subscription,
    "event": EventConfig,
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
        "Billing": {
            "connection": "rabbit",
            "concurrency": "${BILLING_LOOPS:-2}",
            "subscribes": [{"event": "Sales.Messages.OrderPlaced", "publisher": "Sales"}],
        },
    },
    "proxies": {"create": True},
    "events": {"Sales.Messages.OrderPlaced": {"topic": "sales.order-placed"}},
}


def test_a_registry_alone_renders_with_its_connections_and_passes_check(
    chart: helm.Chart,
) -> None:
    secret = {"values": {"LEGACY_ODBC": "Driver=x", "RABBIT_URL": "amqp://r/"}}
    rendered = routes_yaml(render(chart, {"routes": REGISTRY, "secret": secret}))
    # The example's connection stays out; "every connection" is written out as the ones used.
    assert set(rendered["connections"]) == {"legacy", "rabbit"}
    assert rendered["routes"] == []
    assert rendered["proxies"] == {"create": True, "connections": ["legacy", "rabbit"]}
    assert rendered["events"] == REGISTRY["events"]
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


def pod_spec(manifests: Manifests, kind: str = "Deployment", name: str = "") -> dict[str, Any]:
    objects = [o for o in manifests.get(kind, []) if name in o["metadata"]["name"]]
    assert len(objects) == 1, f"expected one {kind} named *{name}*, got {len(objects)}"
    spec: dict[str, Any] = objects[0]["spec"]["template"]["spec"]
    return spec


def test_defaults_alone_stop_at_render_naming_the_missing_variable(chart: helm.Chart) -> None:
    # The example routes need ${SHOP_DSN}: without a value the pod would start and exit with a
    # config error, again and again. The render says what to set instead.
    with pytest.raises(helm.HelmRenderError) as error:
        chart.render(None, name=RELEASE)
    message = str(error.value)
    assert 'connection "example-postgresql" needs ${SHOP_DSN}' in message
    assert "secret.values.SHOP_DSN" in message and "secret.existingSecret" in message


@pytest.mark.parametrize(
    "given",
    [
        {"secret": {"values": {"SHOP_DSN": "postgresql://u@db/shop"}}},
        {"secret": {"existingSecret": "shop-credentials"}},  # its keys are not for the chart to see
        DEFAULTS,  # an env entry
    ],
    ids=["secret-values", "existing-secret", "env"],
)
def test_a_variable_given_any_way_renders(chart: helm.Chart, given: dict[str, Any]) -> None:
    assert routes_yaml(render(chart, given))["connections"]["example-postgresql"]["dsn"] == (
        "${SHOP_DSN}"
    )


def test_every_variable_without_a_default_needs_a_value(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match=r"needs \$\{SHOP_DSN\}"):
        chart.render({"secret": {"values": {"SHOP_DSN": ""}}}, name=RELEASE)  # empty is none
    routes = copy.deepcopy(MY_ROUTES)
    routes["routes"][0]["batch_size"] = "${BATCH}"
    secret = {"values": {"LEGACY_ODBC": "Driver=x", "RABBIT_URL": "amqp://r/"}}
    with pytest.raises(helm.HelmRenderError, match=r"routes needs \$\{BATCH\}"):
        chart.render({"routes": routes, "secret": secret}, name=RELEASE)
    with pytest.raises(helm.HelmRenderError, match=r'connection "rabbit" needs \$\{RABBIT_URL\}'):
        chart.render({"routes": MY_ROUTES, "secret": {"values": {"LEGACY_ODBC": "x"}}})
    routes["routes"][0]["batch_size"] = "${BATCH:-100}"  # a default is a value
    render(chart, {"routes": routes, "secret": secret})


def test_bridge_check_runs_before_the_service_in_an_init_container(
    chart: helm.Chart, full: Manifests
) -> None:
    pod = pod_spec(full)
    (check,) = pod["initContainers"]
    main = container(full)
    assert check["name"] == "check"
    assert check["args"] == ["check", "-c", "/etc/bridge/routes.yaml"]
    for same in ("image", "envFrom", "env", "volumeMounts", "securityContext", "resources"):
        assert check[same] == main[same], same
    connect = pod_spec(render(chart, {**DEFAULTS, "check": {"connect": True}}))
    assert connect["initContainers"][0]["args"][-1] == "--connect"
    off = pod_spec(render(chart, {**DEFAULTS, "check": {"enabled": False}}))
    assert "initContainers" not in off


def test_cpu_requests_follow_workers_unless_set(chart: helm.Chart, default: Manifests) -> None:
    assert container(default)["resources"] == {
        "requests": {"cpu": "1", "memory": "128Mi"},
        "limits": {"memory": "512Mi"},
    }
    four = container(render(chart, {**DEFAULTS, "workers": 4}))["resources"]
    assert four["requests"] == {"cpu": "4", "memory": "128Mi"}
    mine = {"workers": 4, "resources": {"requests": {"cpu": "1500m", "memory": "1Gi"}}}
    assert container(render(chart, {**DEFAULTS, **mine}))["resources"]["requests"] == {
        "cpu": "1500m",
        "memory": "1Gi",
    }


HOOK = "pre-install,pre-upgrade"


def test_bridge_install_is_an_opt_in_hook_job(chart: helm.Chart, default: Manifests) -> None:
    assert "Job" not in default
    manifests = render(chart, JOBS)
    job = next(j for j in manifests["Job"] if j["metadata"]["name"] == f"{FULLNAME}-install")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == HOOK
    assert "hook-succeeded" in annotations["helm.sh/hook-delete-policy"]
    pod = job["spec"]["template"]["spec"]
    (install,) = pod["containers"]
    assert install["args"] == ["install", "-c", "/etc/bridge/routes.yaml"]
    assert pod["restartPolicy"] == "Never"
    assert install["securityContext"] == container(manifests)["securityContext"]
    # Hooks run before the release's ConfigMap and Secret exist: the hook has its own copies,
    # made first (a lower weight), with the same routes.yaml and values.
    volumes = {v["name"]: v for v in pod["volumes"]}
    hook_config = next(
        c for c in manifests["ConfigMap"] if c["metadata"]["name"] == f"{FULLNAME}-install"
    )
    assert volumes["routes"]["configMap"]["name"] == hook_config["metadata"]["name"]
    release_config = next(c for c in manifests["ConfigMap"] if c["metadata"]["name"] == FULLNAME)
    assert hook_config["data"] == release_config["data"]
    secrets = {s["metadata"]["name"]: s for s in manifests["Secret"]}
    assert secrets[f"{FULLNAME}-install"]["data"] == secrets[FULLNAME]["data"]
    assert install["envFrom"] == [{"secretRef": {"name": f"{FULLNAME}-install"}}]
    for made_first in (hook_config, secrets[f"{FULLNAME}-install"]):
        assert made_first["metadata"]["annotations"]["helm.sh/hook"] == HOOK
        weight = int(made_first["metadata"]["annotations"]["helm.sh/hook-weight"])
        assert weight < int(annotations["helm.sh/hook-weight"])
    # An existing Secret is there before the hook: used as it is, no copy made.
    existing = render(
        chart, {"install": {"enabled": True}, "secret": {"existingSecret": "shop-credentials"}}
    )
    assert "Secret" not in existing
    (install,) = pod_spec(existing, "Job", "-install")["containers"]
    assert install["envFrom"] == [{"secretRef": {"name": "shop-credentials"}}]


def test_bridge_migrate_runs_as_a_job_on_the_spark_image(chart: helm.Chart) -> None:
    manifests = render(chart, JOBS)
    job = next(j for j in manifests["Job"] if "-migrate-" in j["metadata"]["name"])
    assert job["metadata"]["name"] == f"{FULLNAME}-migrate-1"  # one per release revision
    assert "helm.sh/hook" not in job["metadata"].get("annotations", {})
    pod = job["spec"]["template"]["spec"]
    (migrate,) = pod["containers"]
    assert migrate["image"] == "bridge:0.1.0-spark"
    assert migrate["args"] == [
        *("migrate", "--route", "shipping-to-rabbit", "-c", "/etc/bridge/routes.yaml"),
        *("--master", "local[2]"),
    ]
    assert migrate["resources"]["requests"]["cpu"] == "2"  # the cores local[N] uses
    assert migrate["envFrom"] == container(manifests)["envFrom"]
    assert migrate["workingDir"] == "/tmp"
    assert pod["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["routes"]["configMap"]["name"] == FULLNAME
    tuned = {
        "enabled": True,
        "route": "proxy.rabbit.Sales",  # a route the registry derives
        "cores": 6,
        "partitions": 24,
        "image": {"repository": "registry.example.com/bridge-spark", "tag": "7"},
    }
    registry = {"routes": REGISTRY, "secret": {"values": {"LEGACY_ODBC": "x", "RABBIT_URL": "y"}}}
    (migrate,) = pod_spec(render(chart, {**registry, "migrate": tuned}), "Job")["containers"]
    assert migrate["image"] == "registry.example.com/bridge-spark:7"
    assert migrate["args"][-4:] == ["--master", "local[6]", "--partitions", "24"]
    assert migrate["resources"]["requests"]["cpu"] == "6"
    cluster = {**tuned, "master": "spark://spark:7077"}
    (migrate,) = pod_spec(render(chart, {**registry, "migrate": cluster}), "Job")["containers"]
    assert migrate["args"][migrate["args"].index("--master") + 1] == "spark://spark:7077"


def test_a_migrate_job_needs_a_route_the_config_has(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match=r"migrate\.route: name the route"):
        chart.render({**DEFAULTS, "migrate": {"enabled": True}}, name=RELEASE)
    with pytest.raises(helm.HelmRenderError, match=r'no route named "sales-to-kafak"'):
        chart.render({**DEFAULTS, "migrate": {"enabled": True, "route": "sales-to-kafak"}})


def test_the_delays_connection_renders_even_when_no_route_uses_it(chart: helm.Chart) -> None:
    """`delays: {connection}` (messaging-bridge.md §4) keeps its connection in routes.yaml."""
    routes = {
        **MY_ROUTES,
        "connections": {**MY_ROUTES["connections"], "waits": {"type": "sqlite", "path": "/d"}},
        "delays": {"connection": "waits"},
    }
    rendered = routes_yaml(render(chart, {"routes": routes, "secret": FULL["secret"]}))
    assert rendered["delays"] == {"connection": "waits"}
    assert set(rendered["connections"]) == {"legacy", "rabbit", "waits"}

"""The Helm chart (deploy/helm/tokenrouter): `helm lint --strict` and `helm template` through
Helm's own Go SDK (helm-python-sdk: no helm binary), every rendered manifest validated against
the Kubernetes API schemas (kubernetes-validate, offline), and what the pools must hold."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

helm = pytest.importorskip("helm_python")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

CHART = Path(__file__).resolve().parent.parent / "deploy" / "helm" / "tokenrouter"
KUBE_VERSION = "1.30.0"  # the oldest Kubernetes the chart targets (autoscaling/v2, sidecar probes)
WARNING = 2  # helm lint severities: 1 info, 2 warning, 3 error


def render(values: dict | None = None) -> dict[tuple[str, str], dict]:
    """(kind, name) -> manifest, every one valid against the Kubernetes schemas."""
    with helm.Chart.load(str(CHART)) as chart:
        files = chart.render(values=values, name="tr", namespace="ml")
    docs = {}
    for path, text in files.items():
        if not path.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
                docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


def pod(docs, pool: str) -> dict:
    return docs[("Deployment", f"tr-tokenrouter-{pool}")]["spec"]["template"]


def container(docs, pool: str, name: str) -> dict:
    return next(c for c in pod(docs, pool)["spec"]["containers"] if c["name"] == name)


def test_lint_is_clean():
    report = helm.lint(str(CHART), strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= WARNING] == []


def test_default_render_has_both_pools_and_the_heavy_hpa():
    docs = render()
    assert set(docs) == {("Deployment", "tr-tokenrouter-router"), ("Deployment", "tr-tokenrouter-heavy"),
                         ("Service", "tr-tokenrouter-router"), ("Service", "tr-tokenrouter-heavy"),
                         ("HorizontalPodAutoscaler", "tr-tokenrouter-heavy"),
                         ("NetworkPolicy", "tr-tokenrouter-router"), ("NetworkPolicy", "tr-tokenrouter-heavy")}
    load = lambda c: [a.split("=", 1)[1] for a in c["args"] if a.startswith("--load-model=")]  # noqa: E731
    assert load(container(docs, "heavy", "triton")) == ["heavy"]
    assert load(container(docs, "router", "triton")) == ["preprocessing", "router", "light", "postprocessing",
                                                        "tokenrouter"]
    env = {e["name"]: e["value"] for e in container(docs, "router", "triton")["env"]}
    assert env["TOKENROUTER_HEAVY_URL"] == "tr-tokenrouter-heavy:8001"
    assert docs[("Service", "tr-tokenrouter-heavy")]["spec"]["sessionAffinity"] == "ClientIP"


def test_probes_annotations_and_gpu_requests():
    docs = render()
    for pool in ("router", "heavy"):
        triton = container(docs, pool, "triton")
        assert triton["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
        assert triton["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
        assert triton["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
        notes = pod(docs, pool)["metadata"]["annotations"]
        assert notes == {"prometheus.io/scrape": "true", "prometheus.io/port": "8002", "prometheus.io/path": "/metrics"}
    heavy = container(docs, "heavy", "triton")["resources"]
    assert heavy["requests"]["nvidia.com/gpu"] == heavy["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in container(docs, "router", "triton")["resources"]["requests"]
    openai = container(docs, "router", "openai")
    assert openai["command"] == ["tokenrouter", "openai"] and "--triton-grpc=127.0.0.1:8001" in openai["args"]
    assert openai["readinessProbe"]["httpGet"]["path"] == "/health"
    hpa = docs[("HorizontalPodAutoscaler", "tr-tokenrouter-heavy")]["spec"]
    metric = hpa["metrics"][0]["pods"]
    assert metric["metric"]["name"] == "nv_inference_pending_request_count"
    assert metric["metric"]["selector"]["matchLabels"] == {"model": "heavy"}
    assert "replicas" not in docs[("Deployment", "tr-tokenrouter-heavy")]["spec"]  # the HPA owns it


def test_values_switch_sources_front_and_autoscaling():
    docs = render({"modelRepository": {"source": "init", "init": {"image": "models:1"}},
                   "router": {"openai": {"enabled": False}, "autoscaling": {"enabled": True}},
                   "heavy": {"autoscaling": {"enabled": False}, "replicas": 3, "gpus": 2}})
    spec = pod(docs, "heavy")["spec"]
    assert spec["initContainers"][0]["image"] == "models:1"
    assert next(v for v in spec["volumes"] if v["name"] == "models")["emptyDir"]
    assert [c["name"] for c in pod(docs, "router")["spec"]["containers"]] == ["triton"]
    assert ("HorizontalPodAutoscaler", "tr-tokenrouter-router") in docs
    assert ("HorizontalPodAutoscaler", "tr-tokenrouter-heavy") not in docs
    assert docs[("Deployment", "tr-tokenrouter-heavy")]["spec"]["replicas"] == 3
    assert container(docs, "heavy", "triton")["resources"]["limits"]["nvidia.com/gpu"] == 2


def test_triton_runs_through_the_wrapper_under_the_stub_watchdog():
    from tokenrouter_backend.server.stub_watch import STOP_EXTRA_GRACE_S

    for values, pools in ((None, ("router", "heavy")),
                          ({"heavy": {"pool": "statefulset", "autoscaling": {"enabled": False}}}, ("heavy",))):
        docs = render(values)
        for pool in pools:
            kind = "StatefulSet" if values else "Deployment"
            spec = docs[(kind, f"tr-tokenrouter-{pool}")]["spec"]["template"]["spec"]
            triton = next(c for c in spec["containers"] if c["name"] == "triton")
            # the wrapper adds the secure flags and execs the watchdog around tritonserver
            assert triton["command"] == ["/opt/nvidia/nvidia_entrypoint.sh", "/opt/tokenrouter/docker/tritonserver.sh"]
            env = {e["name"]: e["value"] for e in triton["env"]}
            assert env["TOKENROUTER_STUB_WATCH"] == "1" and env["TOKENROUTER_STUB_WATCH_POLL_S"] == "2"
            # the watchdog's exit 3 restarts the container: pods restart always (the default)
            assert spec.get("restartPolicy", "Always") == "Always"
            # a graceful stop (Triton's exit timeout, then the watchdog's SIGKILL grace) fits the pod's
            exit_timeout = int(next(a for a in triton["args"] if a.startswith("--exit-timeout-secs=")).split("=")[1])
            assert spec["terminationGracePeriodSeconds"] >= exit_timeout + STOP_EXTRA_GRACE_S
    off = render({"stubWatch": {"enabled": False, "pollSeconds": 0.5}})
    env = {e["name"]: e["value"] for e in container(off, "heavy", "triton")["env"]}
    assert env["TOKENROUTER_STUB_WATCH"] == "0" and env["TOKENROUTER_STUB_WATCH_POLL_S"] == "0.5"


@pytest.mark.parametrize("values, named", [
    ({"modelRepository": {"source": "s3"}}, "modelRepository.source"),
    ({"modelRepository": {"source": "init"}}, "modelRepository.init.image"),
    ({"stubWatch": {"pollSeconds": 0}}, "stubWatch.pollSeconds"),
    ({"stubWatch": {"pollSeconds": 61}}, "stubWatch.pollSeconds"),
])
def test_bad_values_fail_naming_the_value(values, named):
    with pytest.raises(helm.HelmError, match=named.replace(".", r"\.")):
        render(values)


def test_statefulset_pool_gives_every_heavy_pod_an_address_the_router_lists():
    from tokenrouter_backend.branches.heavy_pool import parse_heavy_urls

    docs = render({"heavy": {"pool": "statefulset", "replicas": 3, "autoscaling": {"enabled": False}}})
    assert ("Deployment", "tr-tokenrouter-heavy") not in docs
    sts = docs[("StatefulSet", "tr-tokenrouter-heavy")]["spec"]
    assert sts["replicas"] == 3 and sts["serviceName"] == "tr-tokenrouter-heavy"
    triton = next(c for c in sts["template"]["spec"]["containers"] if c["name"] == "triton")
    assert [a for a in triton["args"] if a.startswith("--load-model=")] == ["--load-model=heavy"]
    service = docs[("Service", "tr-tokenrouter-heavy")]["spec"]
    assert service["clusterIP"] == "None" and "sessionAffinity" not in service
    env = {e["name"]: e["value"] for e in container(docs, "router", "triton")["env"]}
    assert parse_heavy_urls(env["TOKENROUTER_HEAVY_URL"]) == tuple(
        f"tr-tokenrouter-heavy-{i}.tr-tokenrouter-heavy.ml.svc:8001" for i in range(3))
    assert not any(kind == "HorizontalPodAutoscaler" for kind, _ in docs)


@pytest.mark.parametrize("heavy, named", [
    ({"pool": "ring"}, "heavy.pool"),
    ({"pool": "statefulset"}, "heavy.autoscaling.enabled"),
])
def test_bad_heavy_pool_values_fail_naming_the_value(heavy, named):
    with pytest.raises(helm.HelmError, match=named.replace(".", r"\.")):
        render({"heavy": heavy})


# ---- hardening ----------------------------------------------------------------------------
WRITABLE = {"/dev/shm", "/tmp", "/home/tokenrouter"}  # everything else: read-only root filesystem, read-only models


def pod_specs(docs) -> list[dict]:
    return [d["spec"]["template"]["spec"] for (kind, _), d in docs.items() if kind in ("Deployment", "StatefulSet")]


HARDENING_CASES = [
    None,
    {"modelRepository": {"source": "init", "init": {"image": "models:1"}}},
    {"heavy": {"pool": "statefulset", "autoscaling": {"enabled": False}}},
]


@pytest.mark.parametrize("values", HARDENING_CASES)
def test_pods_run_non_root_without_token_privileges_or_writable_root(values):
    docs = render(values)
    specs = pod_specs(docs)
    assert len(specs) == 2
    for spec in specs:
        assert spec["automountServiceAccountToken"] is False
        assert spec["shareProcessNamespace"] is False  # no sidecar reads tritonserver's command line
        pod_ctx = spec["securityContext"]
        assert pod_ctx["runAsNonRoot"] is True and pod_ctx["runAsUser"] == 10001
        assert pod_ctx["seccompProfile"] == {"type": "RuntimeDefault"}
        volumes = {v["name"]: v for v in spec["volumes"]}
        for container in spec["containers"] + spec.get("initContainers", []):
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, container["name"]
            assert ctx["readOnlyRootFilesystem"] is True, container["name"]
            assert ctx["capabilities"] == {"drop": ["ALL"]}, container["name"]
            assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}, container["name"]
        for container in spec["containers"]:
            mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
            writable = {path for path, m in mounts.items() if not m.get("readOnly")}
            assert writable == WRITABLE, container["name"]
            assert mounts["/models"]["readOnly"] is True, container["name"]
            for path in WRITABLE:  # each writable place is an emptyDir with a size limit
                volume = volumes[mounts[path]["name"]]
                assert volume["emptyDir"]["sizeLimit"], path
        assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"


def test_writable_home_is_where_the_wrapper_writes_the_admin_key():
    """docker/tritonserver.sh writes ~/tokenrouter-admin.key; ~ is the image user's home."""
    wrapper = (CHART.parents[2] / "docker" / "tritonserver.sh").read_text()
    assert "${HOME:-.}/tokenrouter-admin.key" in wrapper
    dockerfile = (CHART.parents[2] / "Dockerfile").read_text()
    assert "useradd --create-home --uid 10001 --user-group tokenrouter" in dockerfile  # home: /home/tokenrouter
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == 10001


def ingress_rules(docs, pool: str) -> list[dict]:
    policy = docs[("NetworkPolicy", f"tr-tokenrouter-{pool}")]["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == pool
    for rule in policy["ingress"]:
        assert rule.get("from"), f"{pool}: a rule without peers admits everybody"
    return policy["ingress"]


def ports_of(rule: dict) -> set[str]:
    return {p["port"] for p in rule["ports"]}


def test_network_policies_admit_clients_to_the_serving_ports_and_scrapers_to_metrics():
    docs = render()
    router = ingress_rules(docs, "router")
    assert [ports_of(r) for r in router] == [{"http", "grpc", "openai"}, {"metrics"}]
    assert router[0]["from"] == [{"podSelector": {"matchLabels": {"tokenrouter-client": "true"}}}]
    assert router[1]["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    heavy = ingress_rules(docs, "heavy")
    assert [ports_of(r) for r in heavy] == [{"grpc"}, {"metrics"}]
    assert heavy[0]["from"] == [{"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "tokenrouter", "app.kubernetes.io/instance": "tr",
        "app.kubernetes.io/component": "router"}}}]
    # every named port exists on the pods the policy selects
    for pool, rules in (("router", router), ("heavy", heavy)):
        names = {p["name"] for c in pod(docs, pool)["spec"]["containers"] for p in c.get("ports", [])}
        assert set().union(*(ports_of(r) for r in rules)) <= names, pool


def test_network_policy_values():
    clients = [{"namespaceSelector": {"matchLabels": {"team": "apps"}}}]
    docs = render({"networkPolicy": {"clients": clients, "metrics": []}, "router": {"openai": {"enabled": False}}})
    router = ingress_rules(docs, "router")
    assert [ports_of(r) for r in router] == [{"http", "grpc"}] and router[0]["from"] == clients
    assert [ports_of(r) for r in ingress_rules(docs, "heavy")] == [{"grpc"}]
    # an empty list admits nobody: the policy has no rule for those ports (never an open one)
    closed = render({"networkPolicy": {"clients": [], "metrics": []}})
    assert closed[("NetworkPolicy", "tr-tokenrouter-router")]["spec"]["ingress"] == []
    off = render({"networkPolicy": {"enabled": False}})
    assert not any(kind == "NetworkPolicy" for kind, _ in off)

"""The rendered objects themselves: selectors, ports, probes, mounts, security, resources, secrets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import CI_VALUES, NAMESPACE, Rendered, ci_values, container, name, pod_spec, render

ALL = pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name.removesuffix("-values.yaml"))


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(workload)
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def subset(small: dict[str, str], big: dict[str, str]) -> bool:
    return all(big.get(k) == v for k, v in small.items())


@ALL
def test_selectors_match_their_pod_labels_and_no_two_workloads_share_one(values: Path) -> None:
    r = render(values)
    selectors = []
    for w in r.workloads():
        sel = w["spec"]["selector"]["matchLabels"]
        assert subset(sel, w["spec"]["template"]["metadata"]["labels"]), w["metadata"]["name"]
        selectors.append(tuple(sorted(sel.items())))
    assert len(set(selectors)) == len(selectors), "two workloads select the same pods"


@ALL
def test_services_select_pods_and_target_named_container_ports(values: Path) -> None:
    r = render(values)
    for svc in r.of("Service"):
        backing = [w for w in r.workloads() if subset(svc["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])]
        assert len(backing) == 1, f"Service {svc['metadata']['name']} selects {len(backing)} workloads"
        ports = {p["name"] for c in pod_spec(backing[0])["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports, (svc["metadata"]["name"], port)


@ALL
def test_every_mount_has_a_volume_and_every_reference_resolves(values: Path) -> None:
    r = render(values)
    secrets = {s["metadata"]["name"] for s in r.of("Secret")} | {"rollmux-bootstrap", "rollmux-redis-url"}
    configmaps = {c["metadata"]["name"] for c in r.of("ConfigMap")}
    for w in r.workloads():
        spec = pod_spec(w)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        claims = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
        for c in containers(w):
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes or m["name"] in claims, (w["metadata"]["name"], c["name"], m["name"])
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] in secrets, (c["name"], ref)
        for v in volumes.values():
            if "secret" in v:
                assert v["secret"]["secretName"] in secrets, v
            if "configMap" in v:
                assert v["configMap"]["name"] in configmaps, v


@ALL
def test_nothing_runs_as_root_except_the_socket_dir_init_with_two_capabilities(values: Path) -> None:
    for w in render(values).workloads():
        spec = pod_spec(w)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] > 0
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        # only the scheduler talks to the API server (with its own ServiceAccount)
        assert spec.get("automountServiceAccountToken") is (spec.get("serviceAccountName") == name("scheduler"))
        for c in containers(w):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
            assert not sc.get("privileged", False)
            if c["name"] == "socket-dir":
                assert sc["runAsUser"] == 0 and sorted(sc["capabilities"]["add"]) == ["CHOWN", "FOWNER"]
            else:
                assert sc["runAsNonRoot"] is True and sc.get("runAsUser", spec["securityContext"]["runAsUser"]) > 0
                assert "add" not in sc["capabilities"]


@ALL
def test_every_container_requests_cpu_and_memory_and_limits_memory(values: Path) -> None:
    for w in render(values).workloads():
        for c in containers(w):
            res = c["resources"]
            assert {"cpu", "memory"} <= set(res["requests"]), (w["metadata"]["name"], c["name"])
            assert "memory" in res["limits"], (w["metadata"]["name"], c["name"])


def test_coordinator_probes_ports_and_single_instance() -> None:
    d = render(ci_values("defaults")).one("Deployment", name("coordinator"))
    assert d["spec"]["replicas"] == 1 and d["spec"]["strategy"] == {"type": "Recreate"}
    c = container(d, "coordinator")
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"grpc": 50051, "http": 8080}
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "--instance-id=$(POD_NAME)" in c["args"]
    assert env["ROLLMUX_REDIS_URL"]["value"] == f"redis://:$(REDIS_PASSWORD)@{name('redis')}.{NAMESPACE}.svc:6379/0"
    assert list(env).index("REDIS_PASSWORD") < list(env).index("ROLLMUX_REDIS_URL")  # $(VAR) needs order
    assert "affinity" not in pod_spec(d)


def test_standby_runs_a_second_pod_with_its_own_instance_id_on_another_node() -> None:
    d = render(ci_values("standby")).one("Deployment", name("coordinator"))
    assert d["spec"]["replicas"] == 2 and d["spec"]["strategy"] == {"type": "Recreate"}
    assert "--instance-id=$(POD_NAME)" in container(d, "coordinator")["args"]  # pod names differ
    term = pod_spec(d)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == d["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize("pool", ["rollout", "train"])
def test_sidecar_daemonset_per_pool(pool: str) -> None:
    r = render(ci_values("defaults"))
    ds = r.one("DaemonSet", name(f"sidecar-{pool}"))
    spec = pod_spec(ds)
    assert spec["nodeSelector"] == {"rollmux.io/pool": pool}
    assert spec["runtimeClassName"] == "nvidia" and spec["hostPID"] is True
    c = container(ds, "sidecar")
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"  # NVML on every GPU ...
    assert "nvidia.com/gpu" not in c["resources"]["requests"] and "nvidia.com/gpu" not in c["resources"]["limits"]
    assert "--node-id=$(NODE_NAME)" in c["args"] and f"--pool={pool}" in c["args"]
    assert f"--coordinator={name('coordinator')}.{NAMESPACE}.svc:50051" in c["args"]
    host = {v["name"]: v for v in spec["volumes"]}["socket-dir"]["hostPath"]
    assert host == {"path": "/run/rollmux", "type": "DirectoryOrCreate"}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["socket-dir"] == "/run/rollmux" and "--socket=/run/rollmux/sidecar.sock" in c["args"]
    assert spec["securityContext"]["runAsGroup"] == 2000  # the socket's group, which job pods add
    init = {i["name"]: i for i in spec["initContainers"]}["socket-dir"]
    assert init["command"][-1] == "chown 10001:2000 /run/rollmux && chmod 0750 /run/rollmux"


def test_sidecar_without_nvml_or_runtime_class_and_a_custom_pool_selector() -> None:
    r = render(ci_values("everything"))
    ds = r.one("DaemonSet", name("sidecar-rollout"))
    assert "runtimeClassName" not in pod_spec(ds) and "initContainers" not in pod_spec(ds)
    c = container(ds, "sidecar")
    assert "--no-nvml" in c["args"] and "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in c["env"]}
    only = render(ci_values("rollout-only"))
    assert [d["metadata"]["name"] for d in only.of("DaemonSet")] == [name("sidecar-rollout")]
    ds = only.one("DaemonSet", name("sidecar-rollout"))
    assert pod_spec(ds)["nodeSelector"] == {"node.example.com/gpu": "h20"}
    assert "--gpu-count=4" in container(ds, "sidecar")["args"]


def test_redis_statefulset_with_pvc_aof_and_a_password_not_in_argv() -> None:
    r = render(ci_values("defaults"))
    sts = r.one("StatefulSet", name("redis"))
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    script = container(sts, "redis")["args"][0]
    assert "--appendonly yes" in script and "--appendfsync everysec" in script and "--dir /data" in script
    assert "requirepass" in script and "$REDIS_PASSWORD" in script  # written to a file, not passed as a flag
    assert len(r.secret_value(name("redis"), "redis-password")) == 32


@pytest.mark.parametrize("values", ["external-redis", "external-redis-secret"])
def test_external_redis_has_no_statefulset_and_reaches_the_coordinator(values: str) -> None:
    r = render(ci_values(values))
    assert not r.of("StatefulSet") and name("redis") not in {s["metadata"]["name"] for s in r.of("Secret")}
    env = {e["name"]: e for e in container(r.one("Deployment", name("coordinator")), "coordinator")["env"]}
    if values == "external-redis":
        assert env["ROLLMUX_REDIS_URL"]["value"] == "redis://redis.shared.svc:6379/3"
    else:
        assert env["ROLLMUX_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "rollmux-redis-url", "key": "url"}


def test_generated_bootstrap_secret_and_an_existing_one() -> None:
    r = render(ci_values("defaults"))
    assert len(r.secret_value(name("auth"), "bootstrap-secret")) == 48
    other = render(ci_values("defaults"), sets=("nameOverride=x",))  # a fresh render draws a fresh secret
    assert other.secret_value("rm-x-auth", "bootstrap-secret") != r.secret_value(name("auth"), "bootstrap-secret")
    e = render(ci_values("everything"))
    assert name("auth") not in {s["metadata"]["name"] for s in e.of("Secret")}
    vol = {v["name"]: v for v in pod_spec(e.one("Deployment", name("coordinator")))["volumes"]}["auth"]
    assert vol["secret"]["secretName"] == "rollmux-bootstrap"


def test_generated_tls_certificate_is_signed_by_its_ca_for_the_service_names(tmp_path: Path) -> None:
    import subprocess

    r = render(ci_values("tls"))
    for key in ("tls.crt", "tls.key", "ca.crt"):
        (tmp_path / key).write_text(r.secret_value(name("tls"), key))
    ok = subprocess.run(["openssl", "verify", "-CAfile", tmp_path / "ca.crt", tmp_path / "tls.crt"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    sans = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", tmp_path / "tls.crt"],
                          capture_output=True, text=True, check=True).stdout
    for dns in (f"{name('coordinator')}.{NAMESPACE}.svc", f"{name('coordinator')}.{NAMESPACE}.svc.cluster.local",
                "rollmux.example.com"):
        assert f"DNS:{dns}" in sans, sans
    d = r.one("Deployment", name("coordinator"))
    args = container(d, "coordinator")["args"]
    assert "--tls-cert=/etc/rollmux/tls/tls.crt" in args and "--tls-key=/etc/rollmux/tls/tls.key" in args
    sidecar = container(r.one("DaemonSet", name("sidecar-train")), "sidecar")
    assert "--tls-ca=/etc/rollmux/tls/ca.crt" in sidecar["args"]


def test_time_slicing_configmap_per_pool_in_the_device_plugin_namespace() -> None:
    cm = render(ci_values("time-slicing")).one("ConfigMap", name("time-slicing"))
    assert cm["metadata"]["namespace"] == "gpu-operator"
    for pool, replicas in (("rollout", 3), ("train", 2)):
        config = yaml.safe_load(cm["data"][f"rollmux-{pool}"])
        assert config["version"] == "v1"
        (res,) = config["sharing"]["timeSlicing"]["resources"]
        assert res == {"name": "nvidia.com/gpu", "replicas": replicas}
    assert name("time-slicing") not in {c["metadata"]["name"] for c in render(ci_values("defaults")).of("ConfigMap")}


def test_catalog_configmap_carries_the_overrides() -> None:
    cm = render(ci_values("everything")).one("ConfigMap", name("catalog"))
    gpus = yaml.safe_load(cm["data"]["gpus.yaml"])["gpus"]
    assert gpus["B200"]["hbm_gb"] == 192 and gpus["H20"] == {"usd_per_gpu_h": 1.6}
    assert yaml.safe_load(render(ci_values("defaults")).one("ConfigMap", name("catalog"))["data"]["gpus.yaml"]) == {
        "gpus": {}}


def monitoring(r: Rendered) -> tuple[dict[str, Any], dict[str, Any]]:
    return r.one("ServiceMonitor", name("coordinator")), r.one("PrometheusRule", "rm-rollmux")


def test_servicemonitor_and_prometheusrule_fields() -> None:
    r = render(ci_values("everything"))
    sm, rule = monitoring(r)
    assert sm["apiVersion"] == rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    svc = r.one("Service", name("coordinator"))
    assert sm["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    assert sm["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]
    assert "http" in {p["name"] for p in svc["spec"]["ports"]}
    (group,) = rule["spec"]["groups"]
    alerts = {a["alert"]: a for a in group["rules"]}
    assert set(alerts) == {"RollMuxCoordinatorNotReady", "RollMuxLeaseRevocationsRising", "RollMuxGrantLatencyHigh",
                           "RollMuxNodeLost"}
    for a in alerts.values():
        assert set(a) == {"alert", "expr", "for", "labels", "annotations"} and a["labels"]["severity"]
        assert f'job="{name("coordinator")}"' in a["expr"]  # the ServiceMonitor's job label: the Service name


def coordinator_labels(r: Rendered) -> dict[str, str]:
    return r.one("Deployment", name("coordinator"))["spec"]["template"]["metadata"]["labels"]


def test_network_policies_admit_only_sidecars_and_operators_to_grpc_and_only_the_coordinator_to_redis() -> None:
    r = render(ci_values("everything"), sets=("redis.enabled=true",))
    coord = r.one("NetworkPolicy", name("coordinator"))
    grpc_rule, http_rule = coord["spec"]["ingress"]
    assert grpc_rule["ports"] == [{"port": "grpc", "protocol": "TCP"}]
    peers = [p["podSelector"]["matchLabels"] for p in grpc_rule["from"]]
    sidecars = [pod_spec(ds)["containers"] and ds["spec"]["template"]["metadata"]["labels"] for ds in r.of("DaemonSet")]
    assert all(subset(peers[0], labels) for labels in sidecars)
    scheduler = r.one("Deployment", name("scheduler"))["spec"]["template"]["metadata"]["labels"]
    assert subset(peers[1], scheduler) and not subset(peers[1], coordinator_labels(r))
    assert peers[2] == {"rollmux.io/operator": "true"}
    coordinator = r.one("Deployment", name("coordinator"))["spec"]["template"]["metadata"]["labels"]
    assert not subset(peers[0], coordinator) and not subset(peers[0], r.one("StatefulSet", name("redis"))[
        "spec"]["template"]["metadata"]["labels"])
    assert http_rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    redis = r.one("NetworkPolicy", name("redis"))
    (only,) = redis["spec"]["ingress"][0]["from"]
    assert subset(only["podSelector"]["matchLabels"], coordinator)


def scheduler_args(r: Rendered) -> dict[str, str]:
    c = container(r.one("Deployment", name("scheduler")), "scheduler")
    return dict(a.removeprefix("--").split("=", 1) if "=" in a else (a.removeprefix("--"), "") for a in c["args"][1:])


def test_scheduler_replicas_elect_a_leader_on_a_lease_and_probe_their_watchdog() -> None:
    r = render(ci_values("defaults"))
    dep = r.one("Deployment", name("scheduler"))
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    args = scheduler_args(r)
    assert "leader-elect" in args and args["lease-namespace"] == NAMESPACE
    assert (args["gpu-resource"], args["pool-label"]) == ("nvidia.com/gpu", "rollmux.io/pool")
    c = container(dep, "scheduler")
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    role = r.one("Role", name("scheduler"))
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "verbs": ["get", "create", "update"]}]
    rules = r.one("ClusterRole", name("scheduler"))["rules"]
    assert not any("leases" in rule["resources"] for rule in rules)  # never cluster-wide
    assert {"pods/eviction", "podgroups"} <= {res for rule in rules for res in rule["resources"]}


def test_renamed_time_sliced_gpus_are_the_resource_the_scheduler_fits() -> None:
    renamed = render(ci_values("time-slicing"), sets=("timeSlicing.renameByDefault=true",))
    assert scheduler_args(renamed)["gpu-resource"] == "nvidia.com/gpu.shared"
    assert scheduler_args(render(ci_values("time-slicing")))["gpu-resource"] == "nvidia.com/gpu"


def test_the_schedulers_metrics_have_a_service_and_a_servicemonitor() -> None:
    r = render(ci_values("everything"))
    svc = r.one("Service", name("scheduler"))
    sm = r.one("ServiceMonitor", name("scheduler"))
    assert sm["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    assert sm["spec"]["endpoints"][0]["port"] == "metrics" == svc["spec"]["ports"][0]["name"]

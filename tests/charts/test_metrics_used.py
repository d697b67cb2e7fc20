"""The dashboard and the alert rules use only metrics (and label values) a running coordinator exports.

A real `rollmux coordinator` process is started with the flags the chart renders, on a real
redis-server with the chart's password and URL form; two node streams and a job drive it through a
grant, a release and a lease expiry, then /metrics is scraped and every selector is checked.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rollmux.coordinator.service.auth import node_token, operator_token
from rollmux.coordinator.service.client import CoordinatorClient, NodeSession
from rollmux.model import JobSpec, Phase, Pool

from .conftest import CHART, ci_values, container, name, render

SELECTOR = re.compile(r"\b(rollmux_[a-z0-9_]+)\b\s*(\{[^}]*\})?")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
SCOPE_LABELS = frozenset({"job", "namespace"})  # added by Prometheus at scrape time, not by the coordinator
LEASE_TTL_S = 1.0


def dashboard_exprs() -> list[str]:
    dash = json.loads((CHART / "files" / "dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return exprs


def rule_exprs() -> list[str]:
    rule = render(ci_values("everything")).one("PrometheusRule", "rm-rollmux")
    return [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]


def selectors(exprs: list[str]) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """(metric name, ((label, value), ...)) for every metric selector; only = matchers on own labels."""
    out = set()
    for expr in exprs:
        for metric, braces in SELECTOR.findall(expr):
            eq = tuple(sorted((k, v) for k, op, v in MATCHER.findall(braces or "")
                              if op == "=" and k not in SCOPE_LABELS))
            out.add((metric, eq))
    return out


def test_the_selector_parser_finds_names_and_label_values() -> None:
    found = selectors(['max(rollmux_nodes{job="x", state="lost"}) > 0 or absent(rollmux_ready{job=~"$job"})',
                       "histogram_quantile(0.99, sum by (le) (rate(rollmux_grant_latency_seconds_bucket[5m])))"])
    assert found == {("rollmux_nodes", (("state", "lost"),)), ("rollmux_ready", ()),
                     ("rollmux_grant_latency_seconds_bucket", ())}


def test_dashboard_covers_the_issue_panels() -> None:
    names = {m for m, _ in selectors(dashboard_exprs())}
    assert {"rollmux_permits_granted_total", "rollmux_permits_revoked_total", "rollmux_queue_length",
            "rollmux_grant_latency_seconds_bucket", "rollmux_provisioned_usd_per_hour", "rollmux_bubble_seconds_total",
            "rollmux_pool_nodes", "rollmux_jobs", "rollmux_nodes"} <= names


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def chart_redis(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A redis-server with the chart's generated password; yields (password, port)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server not found (bash scripts/setup.sh --dev installs it)")
    password = render(ci_values("defaults")).secret_value(name("redis"), "redis-password")
    port = str(free_port())
    conf = tmp_path / "redis.conf"
    conf.write_text(f"requirepass {password}\n")
    proc = subprocess.Popen([binary, str(conf), "--port", port, "--bind", "127.0.0.1", "--dir", str(tmp_path),
                             "--appendonly", "yes", "--save", ""], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def pong() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", int(port)), timeout=0.2) as s:
                s.sendall(f"AUTH {password}\r\nPING\r\n".encode())
                return b"+PONG" in s.recv(64)
        except OSError:
            return False

    try:
        wait_until(pong, 10, "redis-server")
        yield password, port
    finally:
        proc.terminate()
        proc.wait(10)


def coordinator_command(tmp_path: Path, password: str, redis_port: str) -> tuple[list[str], dict[str, str], str]:
    """The chart's coordinator container as a local process: (argv, env additions, bootstrap secret)."""
    r = render(ci_values("defaults"))
    c = container(r.one("Deployment", name("coordinator")), "coordinator")
    secret = r.secret_value(name("auth"), "bootstrap-secret")
    files = {"/etc/rollmux/auth/bootstrap-secret": secret,
             "/etc/rollmux/catalog/gpus.yaml": r.one("ConfigMap", name("catalog"))["data"]["gpus.yaml"]}
    local = {}
    for path, text in files.items():
        local[path] = tmp_path / Path(path).name
        local[path].write_text(text)
    overrides = {"--listen": "127.0.0.1:0", "--http": "127.0.0.1:0", "--lease-ttl": str(LEASE_TTL_S),
                 "--instance-id": "rm-rollmux-coordinator-0", "--log-format": "text"}
    args = []
    for arg in c["args"]:
        flag, _, value = arg.partition("=")
        value = overrides.get(flag, str(local.get(value, value)))
        args.append(f"{flag}={value}" if _ else arg)
    env = {e["name"]: e.get("value", "") for e in c["env"]}
    url = env["ROLLMUX_REDIS_URL"].replace("$(REDIS_PASSWORD)", password)
    url = re.sub(r"@[^/]+/", f"@127.0.0.1:{redis_port}/", url)
    return [sys.executable, "-m", "rollmux", *args, "--port-file", str(tmp_path / "ports.json")], \
        {"ROLLMUX_REDIS_URL": url}, secret


def scrape(http_port: int) -> dict[str, set[tuple[tuple[str, str], ...]]]:
    """Sample name -> the label sets it has, from /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5).read().decode()
    samples: dict[str, set[tuple[tuple[str, str], ...]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, set()).add(tuple(sorted(s.labels.items())))
    return samples


@pytest.mark.timeout(120)
def test_every_metric_the_dashboard_and_rules_use_is_exported(chart_redis: tuple[str, str], tmp_path: Path) -> None:
    import os

    password, redis_port = chart_redis
    argv, env_add, secret = coordinator_command(tmp_path, password, redis_port)
    log = tmp_path / "coordinator.log"
    proc = subprocess.Popen(argv, env={**os.environ, **env_add}, stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    sessions: list[NodeSession] = []
    try:
        ports = tmp_path / "ports.json"
        wait_until(lambda: ports.exists() or proc.poll() is not None, 30, "the coordinator to listen")
        assert proc.poll() is None, f"the coordinator exited {proc.returncode}:\n{log.read_text()}"
        bound = json.loads(ports.read_text())
        address = f"127.0.0.1:{bound['grpc']}"
        def ready() -> bool:
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{bound['http']}/readyz", timeout=5).status == 200
            except OSError:  # 503 until leadership is held and the state loaded
                return False

        wait_until(ready, 30, "/readyz")
        client = CoordinatorClient(address, token=operator_token(secret), retry_s=10)
        for node, pool, gpu in (("r0", Pool.ROLLOUT, "H20"), ("t0", Pool.TRAIN, "H800")):
            sessions.append(NodeSession(client, node, pool, gpu_type=gpu, gpu_count=8, host_dram_bytes=2 << 40,
                                        token=node_token(secret, node), heartbeat_s=0.2).start())
        for s in sessions:
            assert s.connected.wait(10), f"node {s.node_id} did not connect:\n{log.read_text()}"
        job = client.register_job(JobSpec(name="metrics-probe", n_rollout_gpus=8, n_train_gpus=8, t_roll_s=10.0,
                                          t_train_s=10.0, slo=2.0))
        permit = job.acquire(Phase.ROLLOUT, 0, timeout_s=10)
        job.release(permit, duration_s=0.1)
        job.acquire(Phase.TRAIN, 0, timeout_s=10)  # never renewed: its lease expires after LEASE_TTL_S
        sessions.pop().stop()  # t0's stream closes: the node turns lost
        def expired() -> bool:
            revoked = scrape(bound["http"]).get("rollmux_permits_revoked_total", set())
            return (("reason", "expired"),) in revoked

        wait_until(expired, 15, "the lease to expire")
        time.sleep(1.5)  # one more gauge refresh
        samples = scrape(bound["http"])
        client.close()
    finally:
        for s in sessions:
            s.stop()
        proc.terminate()
        proc.wait(15)
    missing = []
    for metric, labels in sorted(selectors(dashboard_exprs() + rule_exprs())):
        have = samples.get(metric)
        if have is None:
            missing.append(f"{metric} (not exported)")
        elif labels and not any(set(labels) <= set(ls) for ls in have):
            missing.append(f"{metric}{dict(labels)} (exported label sets: {sorted(have)})")
    assert not missing, "used by the dashboard or the alert rules but not exported: " + "; ".join(missing)

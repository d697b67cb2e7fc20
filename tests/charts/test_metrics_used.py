"""The dashboard and the alert rules use only metrics (and label values) a running coordinator exports.

A real `rollmux coordinator` process is started with the flags the chart renders, on a real
redis-server with the chart's password and URL form, with two real `rollmux sidecar` processes
started with the sidecar DaemonSets' flags; a job is driven through a grant, a release and a lease
expiry, one sidecar is stopped (its node turns lost), then /metrics is scraped and every selector
is checked.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rollmux.core.model import JobSpec, Phase
from rollmux.wire.auth import operator_token
from rollmux.wire.client import CoordinatorClient

from .conftest import CHART, ci_values, render
from .local_pods import chart_coordinator, chart_sidecar, wait_until

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


def scrape(http_port: int) -> dict[str, set[tuple[tuple[str, str], ...]]]:
    """Sample name -> the label sets it has, from /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5).read().decode()
    samples: dict[str, set[tuple[tuple[str, str], ...]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, set()).add(tuple(sorted(s.labels.items())))
    return samples


@pytest.mark.timeout(180)
def test_every_metric_the_dashboard_and_rules_use_is_exported(tmp_path: Path) -> None:
    r = render(ci_values("defaults"))
    with chart_coordinator(r, tmp_path, **{"--lease-ttl": str(LEASE_TTL_S)}) as coord:
        client = CoordinatorClient(coord.address, token=operator_token(coord.secret), retry_s=10)
        with chart_sidecar(r, "rollout", "node-r0", coord, tmp_path):
            with chart_sidecar(r, "train", "node-t0", coord, tmp_path):
                job = client.register_job(JobSpec(name="metrics-probe", n_rollout_gpus=8, n_train_gpus=8,
                                                  t_roll_s=10.0, t_train_s=10.0, slo=2.0,
                                                  rollout_state_bytes=1 << 20, train_state_bytes=1 << 20))
                permit = job.acquire(Phase.ROLLOUT, 0, timeout_s=10)
                job.release(permit, duration_s=0.1)
                job.acquire(Phase.TRAIN, 0, timeout_s=10)  # never renewed: expires after LEASE_TTL_S
            # node-t0's sidecar stopped: its stream closed, the node turns lost

            def expired_and_lost() -> bool:
                samples = scrape(coord.http)
                return ((("reason", "expired"),) in samples.get("rollmux_permits_revoked_total", set())
                        and any(dict(ls) == {"state": "lost"} for ls in samples.get("rollmux_nodes", set()))
                        and node_count(coord.http, "lost") == 1)

            wait_until(expired_and_lost, 20, "the lease to expire and node-t0 to turn lost")
            samples = scrape(coord.http)
        client.close()
    missing = []
    for metric, labels in sorted(selectors(dashboard_exprs() + rule_exprs())):
        have = samples.get(metric)
        if have is None:
            missing.append(f"{metric} (not exported)")
        elif labels and not any(set(labels) <= set(ls) for ls in have):
            missing.append(f"{metric}{dict(labels)} (exported label sets: {sorted(have)})")
    assert not missing, "used by the dashboard or the alert rules but not exported: " + "; ".join(missing)


def node_count(http_port: int, state: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5).read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "rollmux_nodes" and s.labels == {"state": state}:
                return s.value
    return -1.0

"""The flags the chart renders are the real CLI's: parsed by `rollmux coordinator` / `rollmux sidecar`'s parsers."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest

from rollmux.coordinator.service import cli as coordinator_cli
from rollmux.sidecar import cli as sidecar_cli

from .conftest import CI_VALUES, container, name, render

ALL = pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name.removesuffix("-values.yaml"))


def parse(configure: Any, args: list[str], env: dict[str, str]) -> argparse.Namespace:
    """Parse `args` (Kubernetes $(VAR) references expanded from `env`) with the command's real parser."""
    expanded = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]
    parser = argparse.ArgumentParser()
    configure(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(expanded)
    except SystemExit:
        pytest.fail(f"the chart renders flags the CLI refuses: {err.getvalue().strip()}")


@ALL
def test_coordinator_flags_parse_and_carry_the_values(values: Path) -> None:
    d = render(values).one("Deployment", name("coordinator"))
    c = container(d, "coordinator")
    assert c["command"] == ["rollmux"] and c["args"][0] == "coordinator"
    ns = parse(coordinator_cli.configure, c["args"][1:], {"POD_NAME": "rm-rollmux-coordinator-7d9f-x2x"})
    assert ns.instance_id == "rm-rollmux-coordinator-7d9f-x2x"
    assert (ns.listen, ns.http) == ("0.0.0.0:50051", "0.0.0.0:8080")
    assert (ns.lease_ttl, ns.leader_ttl, ns.max_wait, ns.migration_threshold) == (10.0, 5.0, 300.0, 0.8)
    assert (ns.rollout_gpu, ns.train_gpu, ns.gpus_per_node) == ("H20", "H800", 8)
    assert ns.secret_file == "/etc/rollmux/auth/bootstrap-secret" and ns.log_format == "json"
    assert (ns.max_group_size, ns.max_nodes_per_job, ns.heartbeat_interval) == (5, 1024, 2.0)
    assert ns.catalog == "/etc/rollmux/catalog/gpus.yaml" and ns.no_relayed_registration is False
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    for path in filter(None, (ns.secret_file, getattr(ns, "catalog", None), ns.tls_cert, ns.tls_key)):
        assert str(Path(path).parent) in mounts, f"{path} is not on a mounted volume"
    assert ns.embedded is False and ns.redis is None  # the URL comes from $ROLLMUX_REDIS_URL
    assert "ROLLMUX_REDIS_URL" in {e["name"] for e in c["env"]}


@ALL
def test_sidecar_flags_parse_and_carry_the_values(values: Path) -> None:
    for ds in render(values).of("DaemonSet"):
        c = container(ds, "sidecar")
        assert c["command"] == ["rollmux"] and c["args"][0] == "sidecar"
        ns = parse(sidecar_cli.configure, c["args"][1:], {"NODE_NAME": "gpu-node-17"})
        assert ns.node_id == "gpu-node-17" and ns.pool == ds["metadata"]["labels"]["rollmux.io/pool"]
        assert ns.coordinator == f"{name('coordinator')}.rollmux.svc:50051"
        assert ns.socket == "/run/rollmux/sidecar.sock" and ns.ready_file == "/tmp/ready"
        assert ns.secret_file == "/etc/rollmux/auth/bootstrap-secret"
        assert [str(g) for g in ns.allow_group] == ["2000"]
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        for path in filter(None, (ns.secret_file, getattr(ns, "tls_ca", None), ns.socket, ns.ready_file)):
            assert str(Path(path).parent) in mounts, f"{path} is not on a mounted volume"


def test_policy_flag_is_rendered_only_when_set() -> None:
    from .conftest import ci_values

    assert not any(a.startswith("--policy") for a in container(
        render(ci_values("defaults")).one("Deployment", name("coordinator")), "coordinator")["args"])
    args = container(render(ci_values("everything")).one("Deployment", name("coordinator")), "coordinator")["args"]
    assert "--policy=rollmux" in args and args[-1] == "--log-level=debug"


def test_the_schema_offers_exactly_the_coordinator_policies() -> None:
    import json

    from rollmux.coordinator.policy.registry import ONLINE_POLICIES

    from .conftest import CHART

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["coordinator"]["properties"]["policy"]["enum"] == ["", *ONLINE_POLICIES]


def test_the_catalog_configmap_loads_with_the_coordinators_loader(tmp_path: Path) -> None:
    from rollmux.core.model import GpuCatalog

    from .conftest import ci_values

    data = render(ci_values("everything")).one("ConfigMap", name("catalog"))["data"]["gpus.yaml"]
    (tmp_path / "gpus.yaml").write_text(data)
    catalog = GpuCatalog.from_yaml(tmp_path / "gpus.yaml")
    assert catalog["B200"].hbm_gb == 192 and catalog["H20"].usd_per_gpu_h == 1.6 and "H800" in catalog


def test_a_sidecar_heartbeat_slower_than_the_coordinator_expects_is_refused() -> None:
    from .conftest import CHART, helm

    proc = helm("template", "rm", str(CHART), "--set-json", "sidecar.heartbeatSeconds=2", check=False)
    assert proc.returncode != 0 and "must be below coordinator.heartbeatIntervalSeconds" in proc.stderr
    args = container(render(sets=("coordinator.relayedRegistration=false",)).one(
        "Deployment", name("coordinator")), "coordinator")["args"]
    assert "--no-relayed-registration" in args

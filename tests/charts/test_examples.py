"""The job opt-in recipe (NOTES.txt) and the example manifests agree with the chart and the shim."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from rollmux.shim import env as sidecar_env

from .conftest import CHART, K8S_VERSIONS, ci_values, helm, name, pod_spec, render

EXAMPLES = CHART / "examples"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_verl_job_validates(version: str) -> None:
    for doc in docs(EXAMPLES / "verl-grpo-job.yaml"):
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_verl_job_starts_again_when_relocated() -> None:
    """Regrouping is on by default: a relocated job exits 75, and its Job must start it again uncounted."""
    (job,) = docs(EXAMPLES / "verl-grpo-job.yaml")
    (rule,) = job["spec"]["podFailurePolicy"]["rules"]
    assert rule["action"] == "Ignore" and rule["onExitCodes"]["values"] == [75]
    assert rule["onExitCodes"]["containerName"] == pod_spec(job)["containers"][0]["name"]
    assert pod_spec(job)["restartPolicy"] == "Never"  # podFailurePolicy needs it
    assert job["spec"]["backoffLimit"] >= 1  # on a server without podFailurePolicy a relocation is a retry


def test_the_dra_example_validates_on_kubernetes_1_34() -> None:
    claim, pod = docs(EXAMPLES / "dra-shared-gpus.yaml")
    for doc in (claim, pod):
        kubernetes_validate.validate(doc, "1.34.0", strict=True)
    assert pod["spec"]["resourceClaims"][0]["resourceClaimName"] == claim["metadata"]["name"]
    assert "nvidia.com/gpu" not in pod["spec"]["containers"][0]["resources"]["requests"]


def opt_in(spec: dict[str, Any]) -> tuple[str, str, int, dict[str, str]]:
    """(hostPath, socket variable, supplemental group, nodeSelector) of a job pod spec."""
    (c,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    mount = next(m for m in c["volumeMounts"] if "hostPath" in volumes[m["name"]])
    host = volumes[mount["name"]]["hostPath"]
    assert host["type"] == "Directory" and mount["mountPath"] == host["path"]
    (group,) = spec["securityContext"]["supplementalGroups"]
    return host["path"], env[sidecar_env.SIDECAR_SOCKET], group, spec["nodeSelector"]


def test_the_verl_job_opts_in_the_way_the_chart_serves_the_socket() -> None:
    (job,) = docs(EXAMPLES / "verl-grpo-job.yaml")
    path, socket, group, selector = opt_in(pod_spec(job))
    sidecar = render(ci_values("defaults")).one("DaemonSet", name("sidecar-train"))
    host = {v["name"]: v for v in pod_spec(sidecar)["volumes"]}["socket-dir"]["hostPath"]["path"]
    assert path == host == VALUES["sidecar"]["socketDir"] and socket == f"{host}/sidecar.sock"
    assert group == pod_spec(sidecar)["securityContext"]["runAsGroup"]
    assert selector == pod_spec(sidecar)["nodeSelector"]
    assert pod_spec(job)["tolerations"] == VALUES["sidecar"]["tolerations"]


def notes(*sets: str) -> str:
    args = ["install", "rm", str(CHART), "--dry-run=client", "--namespace", "rollmux"]
    for s in sets:
        args += ["--set", s]
    out = helm(*args).stdout
    return out[out.index("NOTES:"):]


def test_notes_print_the_recipe_from_the_values() -> None:
    text = notes("sidecar.socketDir=/var/run/rmx", "sidecar.socketGroup=3100", "timeSlicing.enabled=true")
    recipe = yaml.safe_load(text[text.index("     spec:"):text.index("   A complete veRL example")])
    spec = recipe["spec"]
    (c,) = spec["containers"]
    assert spec["securityContext"]["supplementalGroups"] == [3100]
    assert spec["volumes"] == [{"name": "rollmux", "hostPath": {"path": "/var/run/rmx", "type": "Directory"}}]
    assert c["env"] == [{"name": sidecar_env.SIDECAR_SOCKET, "value": "/var/run/rmx/sidecar.sock"}]
    assert c["volumeMounts"] == [{"name": "rollmux", "mountPath": "/var/run/rmx"}]
    assert "nvidia.com/device-plugin.config=rollmux-rollout" in text and "rm-rollmux-time-slicing" in text
    assert "rollmux.io/pool=rollout" in text and "rollmux.io/pool=train" in text
    assert "rollmux status --coordinator 127.0.0.1:50051" in text
    assert "GPU sharing is off" in notes()


def test_the_status_command_in_the_notes_derives_the_operator_token(tmp_path: Path) -> None:
    import re
    import subprocess
    import sys

    from rollmux.wire.auth import operator_token

    text = notes()
    (code,) = re.findall(r'python -c \\\n\s+"([^"]+)"', text)
    (path,) = re.findall(r"(/etc/rollmux/auth/\S+)\)", text)
    assert path == "/etc/rollmux/auth/bootstrap-secret"
    secret = tmp_path / "bootstrap-secret"
    secret.write_text("s3cret-from-the-chart\n")
    out = subprocess.run([sys.executable, "-c", code, str(secret)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == operator_token("s3cret-from-the-chart")


# ------------------------------------------------------------------------------ the RollMux scheduler
def scheduler_pods(templates: list[tuple[dict[str, Any], int]], owner: str) -> list[Any]:
    """The pods a controller makes from `templates` (template, copies), as the scheduler reads them."""
    from rollmux.k8s.objects import pod_view

    pods = []
    for t, copies in templates:
        for i in range(copies):
            meta = {**t["metadata"], "name": f"{owner}-{len(pods)}-{i}", "namespace": "rl-jobs",
                    "uid": f"u{len(pods)}", "ownerReferences": [{"kind": owner, "name": owner, "controller": True}]}
            pods.append(pod_view({"metadata": meta, "spec": t["spec"]}))
    return pods


def test_the_scheduled_verl_job_is_one_gang_the_scheduler_can_place() -> None:
    from rollmux.k8s.api import Conventions
    from rollmux.k8s.gang import build_gang
    from rollmux.k8s.objects import owner_gang_size
    from rollmux.k8s.spec import gang_spec

    (job,) = docs(EXAMPLES / "verl-grpo-scheduled-job.yaml")
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(job, version, strict=True)
    spec = pod_spec(job)
    assert spec["schedulerName"] == VALUES["scheduler"]["name"]
    size = owner_gang_size("Job", job)
    pods = scheduler_pods([(job["spec"]["template"], size)], "job")
    gs = gang_spec(build_gang("rl-jobs", pods[0].job, pods, lambda ns, o: size,
                              name=Conventions().qualified("rl-jobs", pods[0].job)))
    assert (gs.spec.n_rollout_gpus, gs.spec.n_train_gpus, gs.spec.deployment.value) == (8, 8, "colocated-train")
    env = {e["name"]: e for e in spec["containers"][0]["env"]}  # the driver registers under the placed name
    expanded = env["ROLLMUX_JOB"]["value"].replace("$(POD_NAMESPACE)", "rl-jobs").replace(
        "$(ROLLMUX_JOB_LABEL)", pods[0].job)
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert expanded == gs.spec.name == "rl-jobs.qwen7b-gsm8k-grpo"
    (rule,) = job["spec"]["podFailurePolicy"]["rules"]
    assert rule["action"] == "Ignore" and rule["onExitCodes"]["values"] == [75]  # relocation restarts it


def test_the_rayjob_is_one_gang_of_head_and_workers_over_both_pools() -> None:
    from rollmux.core.model import Pool
    from rollmux.k8s.gang import build_gang
    from rollmux.k8s.objects import owner_gang_size
    from rollmux.k8s.spec import gang_spec

    (rayjob,) = docs(EXAMPLES / "verl-grpo-rayjob.yaml")
    cluster = rayjob["spec"]["rayClusterSpec"]
    size = owner_gang_size("RayJob", rayjob)
    templates = [(cluster["headGroupSpec"]["template"], 1),
                 *((g["template"], g["replicas"]) for g in cluster["workerGroupSpecs"])]
    pods = scheduler_pods(templates, "ray")
    assert size == len(pods) == 3
    for t, _ in templates:
        assert t["spec"]["schedulerName"] == VALUES["scheduler"]["name"]
        assert t["spec"]["nodeSelector"]["rollmux.io/pool"] == t["metadata"]["labels"]["rollmux.io/pool"]
    gs = gang_spec(build_gang("rl-jobs", pods[0].job, pods, lambda ns, o: size))
    assert (gs.spec.n_rollout_gpus, gs.spec.n_train_gpus) == (8, 8)
    assert sorted(pool.value for _, pool in gs.pools) == [Pool.ROLLOUT.value, Pool.TRAIN.value, Pool.TRAIN.value]


def test_notes_name_only_files_that_exist() -> None:
    text = (CHART / "templates" / "NOTES.txt").read_text()  # every branch, whatever the values
    paths = set(re.findall(r"\b((?:charts/rollmux/)?(?:examples|files|docs)/[\w./-]+\.(?:yaml|json|md))", text))
    assert paths, "NOTES.txt names no file: the test looks for examples/, files/ and docs/ paths"
    root = CHART.parents[1]
    for p in paths:
        where = root / p if p.startswith(("charts/", "docs/")) else CHART / p
        assert where.exists(), f"NOTES.txt names {p}, which does not exist"

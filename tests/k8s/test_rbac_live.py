"""The chart's RBAC for the scheduler is enough for everything it does, and no more than it needs,
checked on a real kube-apiserver 1.20.2 with the ClusterRole and binding `helm template` renders."""

from __future__ import annotations

import pytest

from rollmux.core.model import Pool
from rollmux.k8s.kube import KubeClient, KubeError
from tests.charts.conftest import ci_values, name, render

from .builders import job_obj
from .conftest import Env, wait_for
from .test_relocation_live import ANN
from .test_scheduler_live import bound, condition


@pytest.mark.as_chart_scheduler
def test_the_scheduler_works_with_the_charts_rbac_alone(env: Env, kube: KubeClient) -> None:
    rendered = render(ci_values("defaults"))
    for kind, path in (("ClusterRole", "clusterroles"), ("ClusterRoleBinding", "clusterrolebindings")):
        obj = rendered.one(kind, name("scheduler"))
        try:
            kube.create(f"/apis/rbac.authorization.k8s.io/v1/{path}", obj)
        except KubeError as exc:
            if exc.status != 409:  # made by an earlier run of this session's server
                raise
    env.node("r0", Pool.ROLLOUT)
    env.node("t0", Pool.TRAIN)
    env.start()  # lists and watches pods and nodes as the ServiceAccount
    env.kube.create(f"/apis/batch/v1/namespaces/{env.ns}/jobs",  # sized through its Job (get jobs)
                    job_obj("a", ns=env.ns, scheduler=env.scheduler.config.scheduler_name, annotations=ANN))
    got = wait_for("a bound", lambda: bound(env, "a"))  # pods/binding
    assert set(got.values()) == {f"{env.tag}-r0", f"{env.tag}-t0"}
    pod = next(iter(got))
    wait_for("the event", lambda: [e for e in env.events(pod) if e["reason"] == "Scheduled"])  # events
    # the condition follows the event (one queue, in order); an earlier "waiting" one may still be there
    cond = wait_for("the condition", lambda: (c := condition(kube.get(f"/api/v1/namespaces/{env.ns}/pods/{pod}")))
                    and c["status"] == "True" and c)
    assert cond["message"].startswith("placed in group")  # pods/status
    with pytest.raises(KubeError) as exc:  # and nothing it does not need
        env.scheduler.kube.delete(f"/api/v1/namespaces/{env.ns}/pods/{pod}")
    assert exc.value.status == 403
    with pytest.raises(KubeError) as exc:
        env.scheduler.kube.patch(f"/api/v1/nodes/{env.tag}-t0", {"spec": {"unschedulable": True}})
    assert exc.value.status == 403

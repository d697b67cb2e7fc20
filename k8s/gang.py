"""Gang grouping: pending pods of one job wait together until the whole gang is pending.

Pure. The gang's size comes from the ``rollmux.io/gang-size`` annotation, else from the pods'
``scheduling.x-k8s.io/v1alpha1`` PodGroup (``minMember``; the ``scheduling.x-k8s.io/pod-group`` label
names it, as coscheduling and KubeRay's batch-scheduler set it), else from the pods' controller (the
edge looks the group or owner up and passes its size in through `owner_size`). A pod without a
``rollmux.io/job`` label takes its PodGroup's name as the job's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from rollmux.k8s.api import GANG_SIZE, JOB_LABEL, POD_GROUP_LABEL, Code, Gang, Owner, PodView, SchedulerError

NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
MAX_NAME_LEN = 128
"""The coordinator's longest job name (ServiceConfig.max_name_len)."""

OwnerSize = Callable[[str, Owner], int]
"""(namespace, owner) -> pods the owner runs at once; raises SchedulerError where it cannot tell."""


def check_job_name(pod: PodView) -> str:
    """The pod's job name, validated.

    Raises:
        SchedulerError: BAD_INPUT, no rollmux.io/job label or a name the coordinator would refuse.
    """
    name = pod.job or pod.label_map.get(POD_GROUP_LABEL, "")
    if not name:
        raise SchedulerError(Code.BAD_INPUT, f"pod {pod.key} has no {JOB_LABEL} label: label every pod of the job "
                                             "with the job's name")
    if len(name) > MAX_NAME_LEN or not set(name) <= NAME_CHARS:
        raise SchedulerError(Code.BAD_INPUT, f"pod {pod.key} has {JOB_LABEL}={name!r}: expected at most "
                                             f"{MAX_NAME_LEN} letters, digits, '-', '_' or '.'")
    return name


def group_pending(pods: Iterable[PodView]) -> tuple[dict[tuple[str, str], list[PodView]], list[tuple[PodView, str]]]:
    """Pending pods by (namespace, job), and the pods that name no valid job (with the reason)."""
    groups: dict[tuple[str, str], list[PodView]] = defaultdict(list)
    bad: list[tuple[PodView, str]] = []
    for pod in pods:
        try:
            groups[(pod.namespace, check_job_name(pod))].append(pod)
        except SchedulerError as exc:
            bad.append((pod, str(exc)))
    return dict(groups), bad


def gang_size(pods: list[PodView], owner_size: OwnerSize) -> int:
    """How many pods the gang needs.

    Raises:
        SchedulerError: BAD_INPUT, an annotation that does not parse or differs between pods, or no way to tell.
    """
    raw = {p.annotation_map.get(GANG_SIZE) for p in pods} - {None}
    if len(raw) > 1:
        raise SchedulerError(Code.BAD_INPUT, f"pods of job {pods[0].job!r} disagree on {GANG_SIZE}: {sorted(raw)}")
    if raw:
        text = raw.pop() or ""
        if not text.isdigit() or int(text) < 1:
            raise SchedulerError(Code.BAD_INPUT, f"{GANG_SIZE}={text!r} on job {pods[0].job!r}: expected a whole "
                                                 "number >= 1")
        return int(text)
    groups = {p.label_map.get(POD_GROUP_LABEL) for p in pods} - {None}
    if len(groups) > 1:
        raise SchedulerError(Code.BAD_INPUT, f"pods of job {pods[0].job!r} name different PodGroups: {sorted(groups)}")
    if groups:
        return owner_size(pods[0].namespace, Owner(kind="PodGroup", name=str(groups.pop()),
                                                   api_version="scheduling.x-k8s.io/v1alpha1"))
    owners = {p.owner for p in pods}
    if len(owners) != 1 or None in owners:
        raise SchedulerError(Code.BAD_INPUT, f"pods of job {pods[0].job!r} have no single controller to size the "
                                             f"gang from: annotate them with {GANG_SIZE}")
    owner = owners.pop()
    assert owner is not None
    return owner_size(pods[0].namespace, owner)


def build_gang(namespace: str, job: str, pods: list[PodView], owner_size: OwnerSize, name: str = "") -> Gang:
    """One job's pending pods as a gang (sorted by name, so assignment is deterministic); `name`: the
    job's name at the coordinator.

    Raises:
        SchedulerError: BAD_INPUT, see `gang_size`.
    """
    ordered = tuple(sorted(pods, key=lambda p: p.name))
    return Gang(namespace=namespace, job=job, pods=ordered, size=gang_size(list(ordered), owner_size), name=name)


def order_key(pods: list[PodView]) -> tuple[int, str]:
    """Gangs go by priority (highest first), then age (oldest first), as kube-scheduler's queue sorts pods."""
    return (-max((p.priority for p in pods), default=0), min((p.created for p in pods), default=""))

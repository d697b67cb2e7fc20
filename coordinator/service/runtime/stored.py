"""The runtime's stored form: every record under its key (`records.py` lists the keys), and back.

The form is the one a coordinator restarted on an older store reads, so it does not change with
the runtime's inner layout: each part's records are rendered and parsed here under the same keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollmux.coordinator.service.runtime.admission import group_record
from rollmux.coordinator.service.runtime.records import (
    GroupRecord,
    JobRecord,
    Meta,
    NodeRecord,
    PermitRecord,
    RelocationRecord,
    dumps,
)
from rollmux.coordinator.service.runtime.state import RuntimeState


@dataclass(slots=True, kw_only=True)
class Loaded:
    """Stored records parsed, by kind (each goes to the part that owns it)."""

    meta: Meta | None = None
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    permits: dict[str, PermitRecord] = field(default_factory=dict)
    served: dict[str, str] = field(default_factory=dict)  # node -> job whose turn ended last there
    groups: dict[str, GroupRecord] = field(default_factory=dict)
    relocations: dict[str, RelocationRecord] = field(default_factory=dict)
    learned: dict[str, list[list[float]]] = field(default_factory=dict)  # job -> its window of iterations


def records(state: RuntimeState, served: dict[str, str], relocations: dict[str, RelocationRecord],
            learned: dict[str, list[tuple[float, float]]]) -> dict[str, str]:
    """Every record in stored form (to seed a store)."""
    out = {"meta": state.meta.to_json()}
    out.update({f"node/{k}": v.to_json() for k, v in state.nodes.items()})
    out.update({f"job/{k}": v.to_json() for k, v in state.jobs.items()})
    out.update({f"permit/{k}": v.to_json() for k, v in state.permits.items()})
    out.update({f"group/{k}": group_record(g).to_json() for k, g in state.placement.groups.items()})
    out.update({f"served/{k}": dumps(v) for k, v in served.items()})
    out.update({f"relocation/{k}": v.to_json() for k, v in relocations.items()})
    out.update({f"learn/{k}": dumps(v) for k, v in learned.items()})
    return out


_KINDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "node": ("nodes", NodeRecord.from_json),
    "job": ("jobs", JobRecord.from_json),
    "permit": ("permits", PermitRecord.from_json),
    "served": ("served", json.loads),
    "group": ("groups", GroupRecord.from_json),
    "relocation": ("relocations", RelocationRecord.from_json),
    "learn": ("learned", json.loads),
}
"""Key prefix -> the `Loaded` field its records go to and how one is parsed."""


def parse(stored: dict[str, str]) -> Loaded:
    """The stored records by kind; unknown keys are ignored."""
    loaded = Loaded()
    if "meta" in stored:
        loaded.meta = Meta.from_json(stored["meta"])
    for key, raw in stored.items():
        kind, _, ident = key.partition("/")
        if kind in _KINDS:
            name, parse_one = _KINDS[kind]
            getattr(loaded, name)[ident] = parse_one(raw)
    return loaded

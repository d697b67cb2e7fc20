"""Trace files: read and write the CSV a platform team feeds the simulator.

Reading is all-or-nothing: every malformed row is reported (file:line, field, value, allowed
range) and nothing is simulated from a half-read file.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from rollmux.coordinator.sim.api import TraceError, TraceJob
from rollmux.core.errors import SpecError
from rollmux.core.model import GB, ClusterSpec, JobSpec

REQUIRED = ("job_id", "arrival_s", "iterations", "t_roll_s", "t_train_s", "n_rollout_gpus",
            "n_train_gpus", "slo", "rollout_state_gb", "train_state_gb")
OPTIONAL = ("model", "max_tokens", "turns")
MAX_REPORTED = 20  # errors listed in one message before "... and N more"


def _number(raw: str, *, integer: bool, low: float, low_inclusive: bool = True) -> float | int | None:
    try:
        value: float | int = int(raw) if integer else float(raw)
    except ValueError:
        return None
    if not math.isfinite(value) or value < low or (value == low and not low_inclusive):
        return None
    return value


# field -> (parser, allowed-range text)
_FIELDS: dict[str, tuple[Callable[[str], Any], str]] = {
    "arrival_s": (lambda s: _number(s, integer=False, low=0.0), "a number >= 0 (seconds)"),
    "iterations": (lambda s: _number(s, integer=True, low=1), "an integer >= 1"),
    "t_roll_s": (lambda s: _number(s, integer=False, low=0.0, low_inclusive=False), "a number > 0 (seconds)"),
    "t_train_s": (lambda s: _number(s, integer=False, low=0.0, low_inclusive=False), "a number > 0 (seconds)"),
    "n_rollout_gpus": (lambda s: _number(s, integer=True, low=1), "an integer >= 1"),
    "n_train_gpus": (lambda s: _number(s, integer=True, low=1), "an integer >= 1"),
    "slo": (lambda s: _number(s, integer=False, low=1.0), "a number >= 1.0"),
    "rollout_state_gb": (lambda s: _number(s, integer=False, low=0.0), "a number >= 0 (GB)"),
    "train_state_gb": (lambda s: _number(s, integer=False, low=0.0), "a number >= 0 (GB)"),
    "max_tokens": (lambda s: _number(s, integer=True, low=1), "an integer >= 1"),
    "turns": (lambda s: _number(s, integer=True, low=1), "an integer >= 1"),
}


def _parse_row(row: dict[str, str], where: str, errors: list[str]) -> TraceJob | None:
    values: dict[str, Any] = {}
    ok = True
    job_id = (row.get("job_id") or "").strip()
    if not job_id:
        errors.append(f"{where}: job_id={row.get('job_id')!r} is invalid: expected a non-empty string")
        ok = False
    for name, (parse, allowed) in _FIELDS.items():
        raw = row.get(name)
        if raw is None or raw.strip() == "":
            if name in REQUIRED:
                errors.append(f"{where}: {name} is missing: expected {allowed}")
                ok = False
            continue
        value = parse(raw.strip())
        if value is None:
            errors.append(f"{where}: {name}={raw.strip()!r} is invalid: expected {allowed}")
            ok = False
        else:
            values[name] = value
    if not ok:
        return None
    return TraceJob(job_id=job_id, model=(row.get("model") or "").strip(), **values)


def read_trace(path: str | Path) -> list[TraceJob]:
    """All jobs of a trace CSV, sorted by arrival.

    Raises:
        TraceError: missing columns, malformed rows or duplicate job ids (all listed).
    """
    path = Path(path)
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace: {exc.strerror}") from None
    with handle:
        reader = csv.DictReader(handle)
        header = [h.strip() for h in (reader.fieldnames or [])]
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            raise TraceError(f"{path}:1: header lacks column(s) {', '.join(missing)}: expected at least "
                             f"{','.join(REQUIRED)} (optional: {','.join(OPTIONAL)})")
        reader.fieldnames = header
        jobs: list[TraceJob] = []
        errors: list[str] = []
        seen: dict[str, int] = {}
        for row in reader:
            line = reader.line_num
            if not any((v or "").strip() for v in row.values() if isinstance(v, str)):
                continue  # blank line
            if None in row:
                errors.append(f"{path}:{line}: row has {len(header) + len(row[None])} fields, header has "  # type: ignore[index]
                              f"{len(header)}")
                continue
            job = _parse_row(row, f"{path}:{line}", errors)
            if job is None:
                continue
            if job.job_id in seen:
                errors.append(f"{path}:{line}: job_id={job.job_id!r} duplicates line {seen[job.job_id]}: "
                              "expected unique job ids")
                continue
            seen[job.job_id] = line
            jobs.append(job)
    if errors:
        more = f"\n... and {len(errors) - MAX_REPORTED} more" if len(errors) > MAX_REPORTED else ""
        raise TraceError(f"{len(errors)} malformed row(s) in {path}; nothing was simulated:\n"
                         + "\n".join(errors[:MAX_REPORTED]) + more)
    if not jobs:
        raise TraceError(f"{path}: the trace has no jobs: expected at least one row after the header")
    return sorted(jobs, key=lambda j: (j.arrival_s, j.job_id))


def write_trace(jobs: Iterable[TraceJob], path: str | Path) -> None:
    """Write `jobs` in the format `read_trace` reads (required columns, then the optional ones)."""
    with Path(path).open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*REQUIRED, *OPTIONAL])
        for j in jobs:
            w.writerow([j.job_id, f"{j.arrival_s:.0f}", j.iterations, f"{j.t_roll_s:.3f}", f"{j.t_train_s:.3f}",
                        j.n_rollout_gpus, j.n_train_gpus, f"{j.slo:.4f}", f"{j.rollout_state_gb:.1f}",
                        f"{j.train_state_gb:.1f}", j.model, j.max_tokens, j.turns])


def to_job_spec(job: TraceJob, cluster: ClusterSpec) -> JobSpec:
    """The policy's view of a trace row (times and state given, so nothing is estimated).

    Raises:
        TraceError: the job cannot run on `cluster` (its state exceeds a node's host DRAM).
    """
    try:
        spec = JobSpec(name=job.job_id, n_rollout_gpus=job.n_rollout_gpus, n_train_gpus=job.n_train_gpus,
                       slo=job.slo, model_params_b=job.model_params_b, max_tokens=job.max_tokens,
                       turns=job.turns, rollout_state_bytes=int(job.rollout_state_gb * GB),
                       train_state_bytes=int(job.train_state_gb * GB), t_roll_s=job.t_roll_s,
                       t_train_s=job.t_train_s, elastic=job.elastic)
        spec.validate_for(cluster)
    except SpecError as exc:
        raise TraceError(f"job {job.job_id}: {exc}") from None
    return spec


def to_job_specs(jobs: Sequence[TraceJob], cluster: ClusterSpec) -> dict[str, JobSpec]:
    return {j.job_id: to_job_spec(j, cluster) for j in jobs}

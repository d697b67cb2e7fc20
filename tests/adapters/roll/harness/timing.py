"""Timing probes of the CPU harness (the same in unset and opted-in runs; for ``benchmarks/roll_cpu.py``).

* :class:`SpanRecorder`: an OpenTelemetry tracer provider that keeps the driver's spans (ROLL's
  ``get_tracer`` uses the global provider), so each ``pipeline_step`` / phase span has a duration;
* :func:`step_gate`: with it, the driver pauses after each ``pipeline_step`` span until told to go on
  (lets the benchmark alternate the steps of two jobs, one at a time);
* :func:`time_states`: wraps the pipeline's clusters' ``offload_states`` / ``load_states`` (bound per
  instance by ROLL's ``Cluster``) to add up the seconds the driver spends moving model states, and
  to record when each call ran (to check them against the permits the job held).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CLUSTERS = ("actor_train", "actor_infer", "reference", "critic", "reward")


class SpanRecorder:
    """Install once before ``run()``; :meth:`rows` gives ``[name, start_s, end_s]`` of every span ended.
    `on_step_end(k)` runs after the k-th ``pipeline_step`` span (from 0) has ended, in the driver's thread."""

    def __init__(self, on_step_end: Callable[[int], None] | None = None) -> None:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

        rows: list[list[Any]] = []

        class _Keep(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                for s in spans:
                    rows.append([s.name, s.start_time / 1e9, s.end_time / 1e9])
                    if s.name == "pipeline_step" and on_step_end is not None:
                        on_step_end(sum(r[0] == "pipeline_step" for r in rows) - 1)
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_Keep()))
        trace.set_tracer_provider(provider)
        self._rows = rows

    def rows(self) -> list[list[Any]]:
        return sorted(self._rows, key=lambda r: r[1])


def step_gate(folder: Path, timeout_s: float = 900.0) -> Callable[[int], None]:
    """An ``on_step_end`` for :class:`SpanRecorder`: after step k, write ``folder/done-k`` and wait for
    ``folder/go-{k+1}`` (the pause falls between two ``pipeline_step`` spans, outside every span)."""
    folder.mkdir(parents=True, exist_ok=True)

    def pause(k: int) -> None:
        (folder / f"done-{k}").write_text(str(time.time()))
        go, deadline = folder / f"go-{k + 1}", time.monotonic() + timeout_s
        while not go.exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"{go} did not appear within {timeout_s:.0f} s")
            time.sleep(0.02)

    return pause


def _timed(fn: Callable[..., Any], cluster: str, method: str, totals: dict[str, float],
           calls: list[list[Any]]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        t0, wall0 = time.perf_counter(), time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[method] = totals.get(method, 0.0) + time.perf_counter() - t0
            calls.append([cluster, method, wall0, time.time()])

    return call


def time_states(pipeline: Any, calls: list[list[Any]] | None = None) -> dict[str, float]:
    """Wrap every cluster's ``offload_states`` / ``load_states``; returns the live totals (seconds).
    With `calls`, also appends ``[cluster, method, start, end]`` (wall-clock seconds) of every call."""
    totals: dict[str, float] = {}
    calls = [] if calls is None else calls
    clusters = {n: getattr(pipeline, n, None) for n in CLUSTERS}
    clusters |= {f"reward-{k}": v for k, v in (getattr(pipeline, "rewards", None) or {}).items()}
    for name, cluster in clusters.items():
        for method in ("offload_states", "load_states"):
            fn = getattr(cluster, method, None) if cluster is not None else None
            if fn is not None:
                setattr(cluster, method, _timed(fn, name, method, totals, calls))
    return totals

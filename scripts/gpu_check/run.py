"""The device check's runner: five stages, each a child process with its own timeout.

Run through ``scripts/gpu_check.sh`` (which installs what the machine lacks). Each stage writes
``<out>/<stage>.json`` (``{"ok": bool, "figures": {...}, "notes": [...]}``); the runner appends the
stage's output to ``<out>/gpu_check.log``, rewrites ``<out>/summary.json`` as each stage ends, prints
one line per stage and exits non-zero when a stage failed (a stage that timed out or crashed fails).

``--cpu`` runs the same stages on CPU tensors, with the sidecar's per-PID stand-in provider in place of
NVML; ``--small`` scales the sizes down (the test suite runs ``--cpu --small``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    """One stage: its name, its command (run from the checkout's root) and its time limit."""

    name: str  # also the name of its result file
    title: str  # what it checks, for the printed line
    argv: tuple[str, ...]  # command after the python executable
    timeout_s: float  # the stage fails when it runs longer


def stages(out: Path, cpu: bool, small: bool) -> list[Stage]:
    """The five stages in order, with sizes for the mode."""
    mode = (*(("--cpu",) if cpu else ()), *(("--small",) if small else ()))
    gb = "0.05" if small else ("0.5" if cpu else "2")
    return [
        Stage(name="1-env", title="environment and the CUDA context footprint (NVML, per process)",
              argv=(str(HERE / "stage_env.py"), "--out", str(out / "1-env.json"), *mode), timeout_s=60),
        Stage(name="2-cuda-tests", title="the tests that skip without CUDA",
              argv=(str(HERE / "stage_tests.py"), "--out", str(out / "2-cuda-tests.json"), *mode),
              timeout_s=150),
        Stage(name="3-state-cache", title=f"state cache offload/reload of {gb} GB vs plain copy and module.to()",
              argv=(str(ROOT / "benchmarks" / "state_cache.py"), "--gb", gb, "--repeats", "1" if small else "3",
                    "--device", "cpu" if cpu else "cuda", "--json", str(out / "3-state-cache.bench.json")),
              timeout_s=120),
        Stage(name="4-multiplex", title="two tiny GRPO jobs on one GPU under a coordinator and sidecars",
              argv=(str(HERE / "stage_multiplex.py"), "--out", str(out / "4-multiplex.json"),
                    "--workdir", str(out / "multiplex"), *mode), timeout_s=200),
        Stage(name="5-sync", title="sync plugin, gloo with device tensors, several processes on one GPU",
              argv=(str(HERE / "stage_sync.py"), "--out", str(out / "5-sync.json"), *mode), timeout_s=120),
    ]


def state_cache_result(bench: Path) -> dict:
    """Stage 3's verdict from the benchmark's figures: bitwise round trip, and the state's bytes freed."""
    if not bench.exists():
        return {"ok": False, "notes": ["the benchmark wrote no figures"]}
    fig = json.loads(bench.read_text())
    freed = fig["freed"]
    want = fig["state_bytes"]
    notes = []
    ok = bool(fig["bitwise_identical"]) and freed["cache_bytes"] >= want
    if freed["allocator_bytes"] is not None and freed["allocator_bytes"] < 0.99 * want:
        ok = False
        notes.append(f"the allocator freed {freed['allocator_bytes']} of {want} bytes")
    if freed["nvml_bytes"] is not None and freed["nvml_bytes"] < 0.9 * want:
        ok = False
        notes.append(f"NVML shows {freed['nvml_bytes']} of {want} bytes freed (empty_cache missing?)")
    return {"ok": ok, "figures": fig, "notes": notes}


def run_stage(stage: Stage, out: Path, log: Path) -> dict:
    """Run one stage with its timeout; its output goes to the log; returns its result."""
    result_file = out / f"{stage.name}.json"
    result_file.unlink(missing_ok=True)
    start = time.monotonic()
    with log.open("a", encoding="utf-8") as f:
        f.write(f"\n===== stage {stage.name}: {stage.title}\n$ {sys.executable} {' '.join(stage.argv)}\n")
        f.flush()
        try:
            proc = subprocess.run([sys.executable, *stage.argv], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                  timeout=stage.timeout_s, start_new_session=True)
            code: int | str = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    wall = time.monotonic() - start
    if stage.name == "3-state-cache":
        result = state_cache_result(out / "3-state-cache.bench.json")
    elif result_file.exists():
        result = json.loads(result_file.read_text())
    else:
        result = {"ok": False, "notes": ["the stage wrote no result"]}
    if code != 0:
        result["ok"] = False
        result.setdefault("notes", []).append(f"exit {code} after {wall:.0f}s (limit {stage.timeout_s:.0f}s)")
    result.update(stage=stage.name, title=stage.title, wall_s=round(wall, 1), timeout_s=stage.timeout_s)
    return result


def headline(result: dict) -> str:
    """The figures worth a glance, one line."""
    fig = result.get("figures") or {}
    keys = ("cuda_context_bytes", "limit_over_context", "passed", "skipped", "cache_vs_plain_copy",
            "cache_vs_to_cpu", "pcie_fraction", "slowdown", "not_freed_events", "bitwise_identical",
            "nccl_two_ranks_one_gpu")
    parts = []
    for k in keys:
        if fig.get(k) is not None:
            v = fig[k]
            if isinstance(v, dict):
                v = ", ".join(f"{a} {b:.2f}" if isinstance(b, float) else f"{a} {b}" for a, b in v.items())
            parts.append(f"{k}: {v}")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="folder for gpu_check.log, summary.json and each stage's result")
    p.add_argument("--cpu", action="store_true", help="CPU tensors and the per-PID stand-in instead of NVML")
    p.add_argument("--small", action="store_true", help="scaled-down sizes (the test suite's run)")
    p.add_argument("--stages", default="", help="comma-separated stage numbers to run (default: all)")
    args = p.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    log, summary_path = out / "gpu_check.log", out / "summary.json"
    log.write_text(f"gpu_check {'--cpu ' if args.cpu else ''}{'--small ' if args.small else ''}at {time.ctime()}\n")
    chosen = {s.strip() for s in args.stages.split(",") if s.strip()}
    summary: dict = {"mode": "cpu" if args.cpu else "gpu", "small": args.small, "stages": []}
    for stage in stages(out, args.cpu, args.small):
        if chosen and stage.name.split("-")[0] not in chosen:
            continue
        result = run_stage(stage, out, log)
        summary["stages"].append(result)
        summary["ok"] = all(r["ok"] for r in summary["stages"])
        summary_path.write_text(json.dumps(summary, indent=2))
        print(f"[{'PASS' if result['ok'] else 'FAIL'}] {stage.name} ({result['wall_s']:.0f}s): {stage.title}"
              + (f"\n       {headline(result)}" if headline(result) else "")
              + "".join(f"\n       note: {n}" for n in result.get("notes", [])), flush=True)
    ok = bool(summary["stages"]) and all(r["ok"] for r in summary["stages"])
    print(f"gpu_check: {'PASS' if ok else 'FAIL'}; log {log}, summary {summary_path}")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())

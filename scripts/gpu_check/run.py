"""The device check's runner: five stages, each a child process with its own timeout.

Run through ``scripts/gpu_check.sh`` (which runs the pre-flight and installs what the machine lacks).
Each stage writes ``<work>/<stage>.json`` (``{"ok", "figures", "checks", "notes"}``). As each stage
ends the runner appends its output to ``<out>/gpu_check.log``, rewrites ``<out>/summary.json`` and
``<out>/summary.md`` (one row per check, its threshold beside what it measured) and packs the work
folder into ``<out>/details.tar.gz``: four files, so a device tool that returns only a few files from
its output folder returns all of them, and a run cut short still returns what it measured. It prints
one line per stage and one per check, and exits non-zero when a stage failed (a stage that timed out
or crashed fails).

``--cpu`` runs the same stages on CPU tensors, with the sidecar's per-PID stand-in provider in place of
NVML; ``--small`` scales the sizes down (the test suite runs ``--cpu --small``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from result import Check, at_least

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    """One stage: its name, its command (run from the checkout's root) and its time limit."""

    name: str  # also the name of its result file
    title: str  # what it checks, for the printed line
    argv: tuple[str, ...]  # command after the python executable
    timeout_s: float  # the stage fails when it runs longer


CPU_SLACK = 4
"""The CPU run's limits are this many times the GPU run's (2 shared cores in CI, no accelerator)."""


def stages(out: Path, cpu: bool, small: bool) -> list[Stage]:
    """The five stages in order, with sizes and limits for the mode."""
    listed = _stages(out, cpu, small)
    if not cpu:
        return listed
    return [Stage(name=s.name, title=s.title, argv=s.argv, timeout_s=s.timeout_s * CPU_SLACK) for s in listed]


def _stages(out: Path, cpu: bool, small: bool) -> list[Stage]:
    mode = (*(("--cpu",) if cpu else ()), *(("--small",) if small else ()))
    gb = "0.05" if small else ("0.5" if cpu else "2")
    return [
        Stage(name="1-env", title="environment and the CUDA context footprint (NVML, per process)",
              argv=(str(HERE / "stage_env.py"), "--out", str(out / "1-env.json"), *mode), timeout_s=45),
        Stage(name="2-cuda-tests", title="the tests that skip without CUDA",
              argv=(str(HERE / "stage_tests.py"), "--out", str(out / "2-cuda-tests.json"), *mode),
              timeout_s=105),
        Stage(name="3-state-cache", title=f"state cache offload/reload of {gb} GB vs plain copy and module.to()",
              argv=(str(ROOT / "benchmarks" / "state_cache.py"), "--gb", gb, "--repeats", "1" if small else "3",
                    "--device", "cpu" if cpu else "cuda", "--json", str(out / "3-state-cache.bench.json")),
              timeout_s=75),
        Stage(name="4-multiplex", title="two GRPO jobs with their Adam state on one GPU under a coordinator and "
                                        "sidecars, and a held tensor the memory check must catch",
              argv=(str(HERE / "stage_multiplex.py"), "--out", str(out / "4-multiplex.json"),
                    "--workdir", str(out / "multiplex"), *mode), timeout_s=150),
        Stage(name="5-sync", title="sync plugin: gloo with device tensors, and NCCL 1 trainer + 1 rollout on one GPU",
              argv=(str(HERE / "stage_sync.py"), "--out", str(out / "5-sync.json"), *mode), timeout_s=75),
    ]


TOTAL_BUDGET_S = 450.0
"""The stages' limits add up to this (45 + 105 + 75 + 150 + 75 s): with the pre-flight and the offline install,
a GPU run ends within 8 minutes."""

PCIE_FRACTION_MIN = 0.7
"""Offload and reload, end to end, against the PCIe peak the stage measures (one big pinned copy)."""
CACHE_VS_PLAIN_MIN = 0.9
"""The cache's end-to-end bandwidth against a plain copy of the same bytes."""
ALLOCATOR_FREED_MIN = 0.99
NVML_FREED_MIN = 0.9
"""Fractions of the state's bytes an offload must free, as the allocator and as NVML see this process."""


def state_cache_checks(fig: dict, gpu: bool) -> list[Check]:
    """Stage 3's checks from the benchmark's figures. Pure. On CPU only the round trip is judged (bandwidth
    ratios on shared cores are printed, not judged; there is no allocator or NVML figure)."""
    want = fig["state_bytes"]
    freed = fig["freed"]
    fraction = fig.get("pcie_fraction") or {}
    peak = fig.get("pcie_peak_gbps") or {}
    vs_plain = fig.get("cache_vs_plain_copy") or {}
    checks = [Check("every tensor bitwise identical after the round trips", bool(fig["bitwise_identical"]), "== True",
                    bool(fig["bitwise_identical"]))]
    for d in ("offload", "reload"):
        checks.append(at_least(f"{d} vs the measured PCIe peak", fraction.get(d), PCIE_FRACTION_MIN, judged=gpu))
    for d in ("offload", "reload"):
        checks.append(at_least(f"{d} cache_vs_plain_copy", vs_plain.get(d), CACHE_VS_PLAIN_MIN, judged=gpu))
    for d in ("offload", "reload"):
        checks.append(Check(f"PCIe peak {d} GB/s (reference: Gen4 x16 about 25, Gen5 x16 about 50)",
                            None if peak.get(d) is None else round(peak[d], 1), "printed", None))
    if gpu:
        alloc, nvml = freed.get("allocator_bytes"), freed.get("nvml_bytes")
        checks.append(at_least("allocator bytes freed / state bytes", None if alloc is None else alloc / want,
                               ALLOCATOR_FREED_MIN))
        checks.append(at_least("NVML bytes freed for this process / state bytes (0: empty_cache missing, or "
                               "NVML does not see this PID: PID namespace?)",
                               None if nvml is None else nvml / want, NVML_FREED_MIN))
    return checks


def state_cache_result(bench: Path, gpu: bool) -> dict:
    """Stage 3's verdict from the benchmark's figures."""
    if not bench.exists():
        return {"ok": False, "notes": ["the benchmark wrote no figures"]}
    fig = json.loads(bench.read_text())
    checks = state_cache_checks(fig, gpu)
    notes = [f"failed: {c.name}: {c.measured} (needs {c.threshold})" for c in checks if c.ok is False]
    return {"ok": all(c.ok is not False for c in checks), "figures": fig, "checks": [asdict(c) for c in checks],
            "notes": notes}


def markdown(summary: dict) -> str:
    """The summary as a Markdown table: one row per check, thresholds beside what was measured."""
    rows = ["| stage | check | measured | threshold | verdict |", "|---|---|---|---|---|"]
    pre = summary.get("preflight")
    if pre:
        rows.append(f"| 0-preflight | imports and versions | {pre.get('line', '')} | all present | "
                    f"{'PASS' if pre.get('ok') else 'FAIL'} |")
    for st in summary["stages"]:
        verdict = "PASS" if st["ok"] else "FAIL"
        rows.append(f"| {st['stage']} | (stage, {st['wall_s']:.0f} s of {st['timeout_s']:.0f} s) | | | {verdict} |")
        for c in st.get("checks", []):
            v = {True: "pass", False: "FAIL", None: "(not judged)"}[c["ok"]]
            rows.append(f"| {st['stage']} | {c['name']} | {_cell(c['measured'])} | {c['threshold']} | {v} |")
        for n in st.get("notes", []):
            if not n.startswith("failed: "):
                rows.append(f"| {st['stage']} | note | {_cell(n)} | | |")
    head = f"# gpu_check ({summary['mode']}{', small' if summary['small'] else ''}): " \
           f"{'PASS' if summary.get('ok') else 'FAIL'}\n\n"
    return head + "\n".join(rows) + "\n"


def pack(work: Path, dest: Path) -> None:
    """The work folder (each stage's JSON, the benchmark's figures, the jobs' logs) as one archive."""
    tmp = dest.with_suffix(".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(work, arcname="gpu-check-work")
    tmp.replace(dest)


def _rule(check: dict) -> str:
    if check["ok"] is not None:
        return f"needs {check['threshold']}"
    return "for reference" if check["threshold"] == "printed" else f"not judged in this mode; {check['threshold']} on a GPU"


def _cell(v: object) -> str:
    text = json.dumps(v, default=str) if not isinstance(v, str) else v
    return text.replace("|", "/").replace("\n", " ")[:300]


def run_stage(stage: Stage, out: Path, log: Path, gpu: bool, deadline: float) -> dict:
    """Run one stage with its timeout; its output goes to the log; returns its result."""
    result_file = out / f"{stage.name}.json"
    result_file.unlink(missing_ok=True)
    start = time.monotonic()
    limit = max(1.0, min(stage.timeout_s, deadline - start))
    with log.open("a", encoding="utf-8") as f:
        f.write(f"\n===== stage {stage.name}: {stage.title}\n$ {sys.executable} {' '.join(stage.argv)}\n")
        f.flush()
        try:
            proc = subprocess.run([sys.executable, *stage.argv], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                  timeout=limit, start_new_session=True)
            code: int | str = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    wall = time.monotonic() - start
    if stage.name == "3-state-cache":
        result = state_cache_result(out / "3-state-cache.bench.json", gpu)
    elif result_file.exists():
        result = json.loads(result_file.read_text())
    else:
        result = {"ok": False, "notes": ["the stage wrote no result"]}
    if code != 0:
        result["ok"] = False
        result.setdefault("notes", []).append(f"exit {code} after {wall:.0f}s (limit {limit:.0f}s)")
    result.update(stage=stage.name, title=stage.title, wall_s=round(wall, 1), timeout_s=round(limit))
    return result


def printed(result: dict) -> str:
    """The stage's checks, one line each, thresholds beside what was measured; then its other notes."""
    lines = [f"       {'ok  ' if c['ok'] else ('--  ' if c['ok'] is None else 'FAIL')} {c['name']}: "
             f"{_cell(c['measured'])} ({_rule(c)})" for c in result.get("checks", [])]
    lines += [f"       note: {n}" for n in result.get("notes", []) if not n.startswith("failed: ")]
    return "".join("\n" + line for line in lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path,
                   help="folder for gpu_check.log, summary.json, summary.md and details.tar.gz")
    p.add_argument("--work", type=Path, default=None,
                   help="folder for each stage's files (default: a new temporary folder)")
    p.add_argument("--cpu", action="store_true", help="CPU tensors and the per-PID stand-in instead of NVML")
    p.add_argument("--small", action="store_true", help="scaled-down sizes (the test suite's run)")
    p.add_argument("--stages", default="", help="comma-separated stage numbers to run (default: all)")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="all stages together end within this (default: 450 s on a GPU, 4x that with --cpu); a stage "
                        "gets what is left when that is less than its own limit")
    args = p.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = (args.work or Path(tempfile.mkdtemp(prefix="gpu-check-work-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    log, summary_path = out / "gpu_check.log", out / "summary.json"
    log.write_text(f"gpu_check {'--cpu ' if args.cpu else ''}{'--small ' if args.small else ''}at {time.ctime()}\n")
    chosen = {s.strip() for s in args.stages.split(",") if s.strip()}
    deadline = time.monotonic() + (args.budget_s or TOTAL_BUDGET_S * (CPU_SLACK if args.cpu else 1))
    summary: dict = {"mode": "cpu" if args.cpu else "gpu", "small": args.small, "stages": []}
    if (work / "0-preflight.json").exists():  # written by scripts/gpu_check.sh just before
        summary["preflight"] = json.loads((work / "0-preflight.json").read_text())
    for stage in stages(work, args.cpu, args.small):
        if chosen and stage.name.split("-")[0] not in chosen:
            continue
        result = run_stage(stage, work, log, not args.cpu, deadline)
        summary["stages"].append(result)
        summary["ok"] = all(r["ok"] for r in summary["stages"])
        summary_path.write_text(json.dumps(summary, indent=2))
        (out / "summary.md").write_text(markdown(summary))
        pack(work, out / "details.tar.gz")
        print(f"[{'PASS' if result['ok'] else 'FAIL'}] {stage.name} ({result['wall_s']:.0f}s): {stage.title}"
              + printed(result), flush=True)
    ok = bool(summary["stages"]) and all(r["ok"] for r in summary["stages"])
    print(f"gpu_check: {'PASS' if ok else 'FAIL'}; log {log}, summary {summary_path}")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())

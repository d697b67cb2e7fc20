"""Stage 4: two GRPO jobs on one GPU under an embedded coordinator and two sidecars, NVML on.

Each job runs alone first (ungated) for its solo per-iteration time, then both run multiplexed
through permits, with the policy and the trainer's Adam state registered with the state cache
(``rollmux_rank --register-optimizer``). The policy is large enough (about 0.9 GB of weights, 3.6 GB
with gradients and Adam on the trainer) that every rank holds more than the sidecar's per-process
limit while in phase, as NVML sampled it: a missing offload would fail the memory check. Checked: no
two phases on one node overlap, every job keeps its on-policy order, every iteration finished, every
release other than the control's measured under the limit. The positive control: job B's trainer
keeps an unregistered 2 GiB tensor after its ``train(1)`` phase (``rollmux_rank --hold-mib``), so
exactly one ``gpu_memory_not_freed`` event must name that trainer's PID. ``--cpu``: the jobs run on
CPU tensors at small sizes and the sidecars read the per-PID stand-in directory the ranks write
instead of NVML (the in-phase size check is then not judged).
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from pathlib import Path

import result
from result import Check

HOLD_MIB = 2048
MEMORY_WAIT_S = 2.0


def main() -> int:
    args = result.parse(__doc__.split("\n\n")[0], workdir="")
    from rollmux.demo.launch import JobKnobs, LocalCluster, read_jsonl
    from rollmux.demo.report import summarize
    from rollmux.demo.tiny import run_solo
    from rollmux.sidecar.gpu import DEFAULT_PROCESS_LIMIT_BYTES, detect

    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    for f in work.glob("*.jsonl"):
        f.unlink()
    standin = work / "gpu-memory-standin"
    device = "cpu" if args.cpu else "cuda"
    flags = ["--memory-wait-s", str(MEMORY_WAIT_S)]
    flags += ["--no-nvml", "--gpu-memory-standin", str(standin)] if args.cpu else []
    if args.cpu:
        size: tuple[str, ...] = ("--max-new-tokens", "6", "--prompts", "4", "--group-size", "4", "--d-model", "32") \
            if args.small else ("--max-new-tokens", "12", "--prompts", "16", "--group-size", "8")
    else:  # 226M parameters: 0.9 GB of float32 weights per rank, 3.6 GB with gradients and Adam on the trainer
        size = ("--max-new-tokens", "12", "--prompts", "16", "--group-size", "8", "--d-model", "1536",
                "--n-layers", "8", "--n-heads", "12")
    size += ("--register-optimizer",)
    iterations = 3 if args.small or not args.cpu else 6
    jobs = [JobKnobs(name=n, iterations=iterations, seed=s, flags=(*size, "--device", device))
            for n, s in (("job-a", 1), ("job-b", 2))]
    control = ("--hold-mib", str(HOLD_MIB), "--hold-at", "train:1",
               *(("--gpu-memory-standin", str(standin)) if args.cpu else ()))
    provider = detect("H100", 1, memory_standin_dir=str(standin) if args.cpu else None, gpu_type_given=True)
    peak: dict[int, int] = {}
    with LocalCluster(work, fill_saturated=True, sidecar_flags=flags) as cluster:
        solo = {k.name: run_solo(cluster, k, 2, None) for k in jobs}
        tokens = {k.name: cluster.register(k, t_roll_s=solo[k.name].rollout_s, t_train_s=solo[k.name].train_s,
                                           slo=8.0) for k in jobs}
        running = [cluster.launch(dataclasses.replace(k, flags=k.flags + (control if k.name == "job-b" else ())),
                                  tokens[k.name]) for k in jobs]
        pids = {f"{j.knobs.name}/{role}": p.pid for j in running for role, p in (("trainer", j.trainer),
                                                                                  ("rollout", j.rollout))}
        stop = threading.Event()
        sampler = threading.Thread(target=_sample, args=(provider, list(pids.values()), peak, stop), daemon=True)
        sampler.start()
        try:
            _wait(running)
        finally:
            stop.set()
            sampler.join(5)
        done = {j.knobs.name: len(j.records()) for j in running}
    summary = summarize({k: s.iteration_s for k, s in solo.items()}, read_jsonl(work / "phases.jsonl"))
    events = read_jsonl(work / "nodes.jsonl")
    not_freed = [e for e in events if e["event"] == "gpu_memory_not_freed"]
    control_pid = pids["job-b/trainer"]
    after = _after_release(events)
    others_after = {p: b for p, b in after.items() if p != control_pid}
    fig = {
        "solo_iteration_s": {k: round(s.iteration_s, 4) for k, s in solo.items()},
        "mux_iteration_s": {k: round(v, 4) for k, v in summary.mux_s.items() if v == v},
        "slowdown": {k: round(v, 3) for k, v in summary.slowdown.items() if v == v},
        "overlapping_phases": summary.overlaps, "order_violations": summary.order_problems,
        "iterations_done": done, "iterations_wanted": iterations,
        "pids": pids, "in_phase_peak_bytes": {n: peak.get(p) for n, p in pids.items()},
        "after_release_max_bytes": {n: after.get(p) for n, p in pids.items()},
        "limit_bytes": DEFAULT_PROCESS_LIMIT_BYTES, "not_freed_events": len(not_freed),
        "not_freed_pids": [e["pid"] for e in not_freed], "control_pid": control_pid,
        "memory_provider": type(provider).__name__,
    }
    notes = []
    checks = {
        "no two phases overlapped on a node": summary.overlaps == 0,
        "every job kept its on-policy order": summary.order_problems == 0,
        "every iteration finished": all(n == iterations for n in done.values()),
        "exactly one gpu_memory_not_freed event, naming the control's PID":
            [e["pid"] for e in not_freed] == [control_pid],
        "every other release measured under the limit":
            bool(others_after) and all(b <= DEFAULT_PROCESS_LIMIT_BYTES for b in others_after.values()),
    }
    listed = [Check(what, held, "== True", held) for what, held in checks.items()]
    smallest = min((peak.get(p, 0) for p in pids.values()), default=0)
    listed.append(Check("every rank's in-phase peak (NVML) above the per-process limit, so a missing offload "
                        "would be caught", smallest, f"> {DEFAULT_PROCESS_LIMIT_BYTES}",
                        None if args.cpu else smallest > DEFAULT_PROCESS_LIMIT_BYTES))
    fig["median_slowdown"] = round(statistics.median(fig["slowdown"].values()), 3) if fig["slowdown"] else None
    return result.write(args.out, figures=fig, notes=notes, checks=listed)


def _wait(jobs: list) -> None:
    """Until every job's ranks exited; a rank that failed fails the stage (its log is in the workdir)."""
    while True:
        codes = [j.poll() for j in jobs]
        bad = [(j.knobs.name, c) for j, c in zip(jobs, codes) if c not in (None, 0)]
        if bad:
            raise RuntimeError(f"job {bad[0][0]} exited with code {bad[0][1]}; see its *-r*.log")
        if all(c == 0 for c in codes):
            return
        time.sleep(0.2)


def _sample(provider: object, pids: list[int], peak: dict[int, int], stop: threading.Event) -> None:
    """Keep each PID's largest GPU memory reading (10 readings a second)."""
    while not stop.wait(0.1):
        used = provider.process_memory(pids)  # type: ignore[attr-defined]
        for pid, b in (used or {}).items():
            peak[pid] = max(peak.get(pid, 0), b)


def _after_release(events: list[dict]) -> dict[int, int]:
    """Each PID's largest GPU memory at a release, as the sidecars measured it."""
    out: dict[int, int] = {}
    for e in events:
        if e["event"] == "released" and e.get("gpu_bytes"):
            for pid, b in e["gpu_bytes"].items():
                out[int(pid)] = max(out.get(int(pid), 0), int(b))
    return out


if __name__ == "__main__":
    raise SystemExit(main())

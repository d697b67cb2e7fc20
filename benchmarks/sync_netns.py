"""Weight sync on an emulated two-cluster network: two-stage vs star vs single-source broadcast.

Needs root and iproute2 (``ip``, ``tc``). Builds one network namespace per rank, a bridge per cluster
and one tbf-shaped link between them (see ``_sync_testbed.py``), runs every scheme with real gloo
processes, reads the bytes that crossed the cut from the link's counters, and prints:

* per scheme: time, cut bytes / model size, time / two-stage bound, bitwise replica check;
* two-stage speedup over each baseline beside ``R / (1 + (R-1)/R * B_cross/B_intra)``.

Bound (DESIGN.md, sync plugin): ``M/B_cross + (R-1)/R * M/B_intra``. Bandwidth-only emulation (no netem,
so no added RTT). ``--check`` exits 1 below target: two-stage cut bytes 1.00x +-2%, time within 1.25x
of the bound, speedup over star >= 0.8x of theory; a wrong replica always exits 1.

Example: ``sudo .venv/bin/python benchmarks/sync_netns.py --rollouts 8 --model-mb 64 --check``
Namespaces (prefix ``rmxs<pid>``) are deleted on exit, error and Ctrl-C.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _sync_testbed import PORT, Testbed  # noqa: E402

WORKER = Path(__file__).resolve().parent / "_sync_worker.py"
SCHEMES = ("star", "broadcast", "two_stage")
TARGET_CUT = 0.02
TARGET_BOUND = 1.25
TARGET_SPEEDUP = 0.8


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rollouts", type=int, default=4, help="R, rollout ranks (default 4)")
    p.add_argument("--trainers", type=int, default=None, help="N_T, trainer ranks (default R)")
    p.add_argument("--model-mb", type=float, default=64.0, help="model size in MiB (default 64)")
    p.add_argument("--bucket-mb", type=float, default=8.0, help="bucket size in MiB (default 8)")
    p.add_argument("--depth", type=int, default=3, help="buckets in flight per rank (default 3)")
    p.add_argument("--cross-mbit", type=float, default=100.0, help="cross-cluster link, Mbit/s each way")
    p.add_argument("--intra-mbit", type=float, default=2000.0, help="per-rank intra-cluster link, Mbit/s")
    p.add_argument(
        "--schemes", default=",".join(SCHEMES), help="comma-separated subset of " + ",".join(SCHEMES)
    )
    p.add_argument("--repeat", type=int, default=1, help="runs per scheme; the median-time run is reported")
    p.add_argument("--check", action="store_true", help="exit 1 below the targets")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--timeout-s", type=float, default=600.0, help="give up on a scheme after this long")
    return p.parse_args(argv)


def preflight() -> str | None:
    """Why the testbed cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    return f"needs iproute2: {missing} not found" if missing else None


class Run:
    """Owns the testbed, the worker processes and the handshake directory; ``close`` is idempotent."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.n_t = a.trainers or a.rollouts
        self.bed = Testbed(prefix=f"rmxs{os.getpid() % 10000}", n_trainers=self.n_t, n_rollouts=a.rollouts,
                           cross_mbit=a.cross_mbit, intra_mbit=a.intra_mbit)  # fmt: skip
        self.dir = Path(tempfile.mkdtemp(prefix="rmx-sync-"))
        self.procs: list[subprocess.Popen] = []

    def start(self, schemes: list[str], model_bytes: int) -> None:
        self.bed.up()
        world = self.n_t + self.a.rollouts
        for rank in range(world):
            cmd = ["ip", "netns", "exec", self.bed.rank_ns(rank), sys.executable, str(WORKER),
                   "--rank", str(rank), "--world", str(world), "--trainers", str(self.n_t),
                   "--model-bytes", str(model_bytes), "--bucket-bytes", str(int(self.a.bucket_mb * 2**20)), "--depth", str(self.a.depth),
                   "--master", Testbed.addr(0), "--port", str(PORT), "--schemes", ",".join(schemes),
                   "--dir", str(self.dir)]  # fmt: skip
            log = open(self.dir / f"rank{rank}.log", "w")  # noqa: SIM115 (closed with the process)
            self.procs.append(
                subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )

    def wait_file(self, name: str, timeout_s: float) -> Path:
        path, deadline = self.dir / name, time.monotonic() + timeout_s
        while not path.exists():
            for rank, p in enumerate(self.procs):
                if p.poll() not in (None, 0):
                    tail = (self.dir / f"rank{rank}.log").read_text()[-3000:]
                    raise RuntimeError(f"rank {rank} exited with {p.returncode}:\n{tail}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout_s} s for {name}")
            time.sleep(0.02)
        return path

    def measure(self, k: int) -> dict:
        self.wait_file(f"ready_{k}", self.a.timeout_s)
        before = self.bed.cut_bytes()
        (self.dir / f"go_{k}").touch()
        result = json.loads(self.wait_file(f"done_{k}", self.a.timeout_s).read_text())
        after = self.bed.cut_bytes()
        result["cut_bytes"] = after[0] - before[0]
        result["cut_bytes_reverse"] = after[1] - before[1]
        return result

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        self.procs.clear()
        self.bed.down()
        shutil.rmtree(self.dir, ignore_errors=True)


def report(a: argparse.Namespace, n_t: int, model_bytes: int, results: list[dict]) -> tuple[str, list[str]]:
    """Format the table; return it and the list of failed targets."""
    r, m_bits = a.rollouts, model_bytes * 8
    bx, bi = a.cross_mbit * 1e6, a.intra_mbit * 1e6
    bound = m_bits / bx + (r - 1) / r * m_bits / bi
    theory = r / (1 + (r - 1) / r * bx / bi)
    lines = [
        f"R={r} N_T={n_t} M={model_bytes / 2**20:.1f} MiB bucket={a.bucket_mb:g} MiB "
        f"B_cross={a.cross_mbit:g} Mbit/s B_intra={a.intra_mbit:g} Mbit/s (bandwidth-only emulation)",
        f"bound two-stage M/B_cross + (R-1)/R*M/B_intra = {bound:.2f} s; star R*M/B_cross = {r * m_bits / bx:.2f} s",
        f"{'scheme':<10} {'time_s':>8} {'runs (min-max)':>15} {'cut/M':>7} {'time/bound':>10} {'bitwise':>8}",
    ]
    by = {x["scheme"]: x for x in results}
    for x in results:
        spread = f"{min(x['times_s']):.2f}-{max(x['times_s']):.2f}"
        lines.append(f"{x['scheme']:<10} {x['time_s']:8.2f} {spread:>15} {x['cut_bytes'] / model_bytes:7.3f} "
                     f"{x['time_s'] / bound:10.2f} {'ok' if x['bitwise_ok'] else 'WRONG':>8}")  # fmt: skip
    fails = [f"{x['scheme']}: replica not bitwise identical" for x in results if not x["bitwise_ok"]]
    two = by.get("two_stage")
    if two:
        for base in ("star", "broadcast"):
            if base in by:
                s = by[base]["time_s"] / two["time_s"]
                lines.append(f"two_stage speedup over {base:<9}: {s:5.2f}x  (theory R/(1+(R-1)/R*Bx/Bi) = "
                             f"{theory:.2f}x; measured/theory {s / theory:.2f})")  # fmt: skip
                if base == "star" and s < TARGET_SPEEDUP * theory:
                    fails.append(f"speedup over star {s:.2f}x < {TARGET_SPEEDUP} * {theory:.2f}x")
        cut = two["cut_bytes"] / model_bytes
        if abs(cut - 1) > TARGET_CUT:
            fails.append(f"two-stage cut bytes {cut:.3f}x M, target 1.00 +- {TARGET_CUT}")
        if two["time_s"] > TARGET_BOUND * bound:
            fails.append(f"two-stage time {two['time_s']:.2f} s > {TARGET_BOUND} * bound {bound:.2f} s")
    return "\n".join(lines), fails


def median_run(runs: list[dict]) -> dict:
    """The run with the median time (the lower middle one for an even count), plus the spread."""
    ordered = sorted(runs, key=lambda x: x["time_s"])
    out = dict(ordered[(len(ordered) - 1) // 2])
    out["times_s"] = [x["time_s"] for x in runs]
    out["bitwise_ok"] = all(x["bitwise_ok"] for x in runs)
    return out


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    why = preflight()
    if why:
        print(f"sync_netns: cannot run: {why}", file=sys.stderr)
        return 2
    schemes = [s for s in a.schemes.split(",") if s]
    model_bytes = int(a.model_mb * 2**20)
    run = Run(a)
    atexit.register(run.close)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda num, _frame: sys.exit(128 + num))
    try:
        runs = [s for s in schemes for _ in range(a.repeat)]
        run.start(runs, model_bytes)
        raw = [run.measure(k) for k in range(len(runs))]
    finally:
        run.close()
    results = [median_run([x for x in raw if x["scheme"] == s]) for s in schemes]
    table, fails = report(a, run.n_t, model_bytes, results)
    print(table)
    if a.json:
        a.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "results": results}, indent=2)
        )
    for f in fails:
        print(f"target missed: {f}", file=sys.stderr)
    wrong = any(not x["bitwise_ok"] for x in results)
    return 1 if wrong or (a.check and fails) else 0


if __name__ == "__main__":
    sys.exit(main())

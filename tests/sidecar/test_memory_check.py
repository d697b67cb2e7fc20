"""The sidecar's per-process GPU memory check: the NVML provider against pynvml's own structs, and the
check end to end through a real sidecar and coordinator with the per-PID stand-in provider."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rollmux.core.model import Pool
from rollmux.shim import env
from rollmux.sidecar.agent import AgentConfig
from rollmux.sidecar.gpu import (
    CUDA_CONTEXT_BYTES,
    DEFAULT_PROCESS_LIMIT_BYTES,
    MemoryHolder,
    NoGpuProvider,
    NvmlProvider,
    StandInMemoryProvider,
    detect,
    holders_over,
    write_standin_bytes,
)

from .conftest import REPO, Node, register
from .test_agent import WAIT_S, Rank, holder, wait_for

GiB = 1 << 30


# ------------------------------------------------------------------------------- pure pieces


def test_holders_over_lists_each_process_above_the_limit_largest_first() -> None:
    used = {10: 100, 11: 5 * GiB, 12: 2 * GiB, 13: GiB}
    assert holders_over(used, GiB) == [MemoryHolder(pid=11, used_bytes=5 * GiB),
                                       MemoryHolder(pid=12, used_bytes=2 * GiB)]
    assert holders_over(used, 5 * GiB) == []


def test_default_limit_is_derived_from_the_cuda_context() -> None:
    assert DEFAULT_PROCESS_LIMIT_BYTES == 2 * CUDA_CONTEXT_BYTES
    assert AgentConfig(node_id="n", pool=Pool.TRAIN).gpu_mem_limit_bytes == DEFAULT_PROCESS_LIMIT_BYTES


def test_standin_reads_per_pid_files_and_zero_for_a_process_without_one(tmp_path: Path) -> None:
    write_standin_bytes(tmp_path, 101, 3 * GiB)
    write_standin_bytes(tmp_path, 102, 7)
    provider = detect("H800", 1, memory_standin_dir=str(tmp_path))
    assert isinstance(provider, StandInMemoryProvider) and not provider.available
    assert provider.process_memory([101, 102, 103]) == {101: 3 * GiB, 102: 7, 103: 0}
    (tmp_path / "104").write_text("not a number")
    assert provider.process_memory([104]) is None  # unreadable: unknown, never a guess
    assert NoGpuProvider("H800", 1).process_memory([101]) is None


# --------------------------------------------------------------------- NVML, as pynvml shapes it


class FakeNvml:
    """pynvml's module surface the provider uses, answering with pynvml's own structs."""

    def __init__(self, pynvml, per_gpu: list[list[tuple[int, int | None]]]) -> None:  # type: ignore[no-untyped-def]
        self.real, self.per_gpu, self.fail = pynvml, per_gpu, False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.per_gpu)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.65"

    def nvmlDeviceGetMemoryInfo(self, handle: int):  # type: ignore[no-untyped-def]
        return self.real.c_nvmlMemory_t(total=80 * GiB, free=80 * GiB, used=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list:
        if self.fail:
            raise self.real.NVMLError(self.real.NVML_ERROR_UNKNOWN)
        out = []
        for pid, used in self.per_gpu[handle]:
            raw = self.real.c_nvmlProcessInfo_v3_t(pid=pid, usedGpuMemory=0 if used is None else used)
            obj = self.real.nvmlStructToFriendlyObject(raw)
            if used is None:  # what pynvml does with NVML_VALUE_NOT_AVAILABLE
                obj.usedGpuMemory = None
            out.append(obj)
        return out


def test_nvml_provider_sums_each_pid_over_the_gpus() -> None:
    pynvml = pytest.importorskip("pynvml")
    nvml = FakeNvml(pynvml, [[(100, 600 << 20), (200, 3 * GiB)], [(100, 512 << 20), (300, GiB)]])
    provider = NvmlProvider(nvml)
    assert provider.facts().gpu_type == "H100" and provider.facts().gpu_count == 2
    assert provider.process_memory([100, 200, 400]) == {100: 1112 << 20, 200: 3 * GiB, 400: 0}


def test_nvml_provider_answers_unknown_when_nvml_cannot_attribute_memory() -> None:
    pynvml = pytest.importorskip("pynvml")
    nvml = FakeNvml(pynvml, [[(100, None)]])  # containers / MIG: usedGpuMemory not available
    assert NvmlProvider(nvml).process_memory([100]) is None
    nvml = FakeNvml(pynvml, [[(100, GiB)]])
    nvml.fail = True
    assert NvmlProvider(nvml).process_memory([100]) is None


# ------------------------------------------------------------------- the check, end to end


@pytest.fixture
def standin(tmp_path: Path) -> Path:
    d = tmp_path / "gpu-mem"
    d.mkdir()
    return d


@pytest.fixture
def standin_node(make_node, standin: Path):  # type: ignore[no-untyped-def]
    def make(node_id: str, pool: Pool, memory_wait_s: float) -> Node:
        return make_node(node_id, pool, gpu=StandInMemoryProvider(standin, "H800", 1), memory_wait_s=memory_wait_s)

    return make


def _events(node: Node, kind: str) -> list[dict]:
    return [e for e in map(json.loads, node.agent.status()["events"]) if e["event"] == kind]


def test_a_rank_keeping_memory_holds_the_release_until_it_frees_it(coordinator, standin_node, standin) -> None:
    node = standin_node("r0", Pool.ROLLOUT, memory_wait_s=WAIT_S)
    standin_node("t0", Pool.TRAIN, memory_wait_s=WAIT_S)
    token = register(coordinator, "job-m")
    rank = Rank(node.socket, "job-m", token, 0)  # this process: the sidecar sees its pid by SO_PEERCRED
    lease = rank.acquire("rollout", 0)
    write_standin_bytes(standin, os.getpid(), 3 * GiB)  # the phase left 3 GiB on the GPU

    done = threading.Event()
    t = threading.Thread(target=lambda: (rank.release(lease.epoch), done.set()))
    t.start()
    time.sleep(1.0)
    assert not done.is_set(), "the release returned while the rank still held its memory"
    assert holder(coordinator, "r0") == "job-m", "the node went back with the rank's memory still held"

    write_standin_bytes(standin, os.getpid(), 300 << 20)  # down to about a CUDA context
    assert done.wait(WAIT_S)
    t.join(WAIT_S)
    assert holder(coordinator, "r0") == ""
    assert _events(node, "gpu_memory_not_freed") == []
    (released,) = _events(node, "released")
    assert released["gpu_bytes"] == {str(os.getpid()): 300 << 20}


def _run_rank_script(coordinator, standin_node, standin: Path, job: str, script: str) -> tuple[Node, str]:  # type: ignore[no-untyped-def]
    """Run `script` as `job`'s rank on a rollout node whose sidecar waits 1 s for memory (the stand-in
    directory is its argument); returns the node and the script's output."""
    node = standin_node("r0", Pool.ROLLOUT, memory_wait_s=1.0)
    standin_node("t0", Pool.TRAIN, memory_wait_s=1.0)
    token = register(coordinator, job)
    e = {k: v for k, v in os.environ.items() if not k.startswith("ROLLMUX_")}
    e.update({"PYTHONPATH": str(REPO), env.SIDECAR_SOCKET: node.socket, env.JOB: job, env.JOB_TOKEN: token})
    proc = subprocess.run([sys.executable, "-c", script, str(standin)], cwd=REPO, env=e,
                          capture_output=True, text=True, timeout=WAIT_S + 30)
    assert proc.returncode == 0, proc.stderr
    return node, proc.stdout


RANK_KEEPS_MEMORY = r"""
import os, sys, rollmux
from rollmux.sidecar.gpu import write_standin_bytes
rollmux.init()
with rollmux.phase("rollout", iteration=0):
    write_standin_bytes(sys.argv[1], os.getpid(), 2 << 30)  # an unregistered 2 GiB tensor, never freed
print(os.getpid(), flush=True)
rollmux.shutdown()
"""


def test_memory_still_held_when_the_wait_ends_is_reported_by_pid_and_the_node_released(
        coordinator, standin_node, standin) -> None:
    node, out = _run_rank_script(coordinator, standin_node, standin, "job-n", RANK_KEEPS_MEMORY)
    pid = int(out.split()[-1])
    assert pid != os.getpid()

    (event,) = _events(node, "gpu_memory_not_freed")
    assert event["pid"] == pid and event["used_bytes"] == 2 << 30
    assert event["limit_bytes"] == DEFAULT_PROCESS_LIMIT_BYTES and event["waited_s"] >= 1.0
    wait_for(lambda: holder(coordinator, "r0") == "", "the node to be released after the wait")


RANK_WITH_AN_ENGINE_CHILD = r"""
import os, subprocess, sys, time, rollmux
from rollmux.sidecar.gpu import write_standin_bytes
# The child stands in for an inference engine's worker process (vLLM's EngineCore): it is not a rank
# and holds the GPU memory itself, past the end of the phase.
ENGINE = "import os, sys, time; from rollmux.sidecar.gpu import write_standin_bytes; " \
         "write_standin_bytes(sys.argv[1], os.getpid(), 4 << 30); print(os.getpid(), flush=True); time.sleep(60)"
rollmux.init()
with rollmux.phase("rollout", iteration=0):
    engine = subprocess.Popen([sys.executable, "-c", ENGINE, sys.argv[1]], stdout=subprocess.PIPE, text=True)
    engine_pid = int(engine.stdout.readline())
print(os.getpid(), engine_pid, flush=True)
rollmux.shutdown()
engine.kill()
"""


def test_memory_held_by_a_process_under_a_rank_is_checked_and_named(coordinator, standin_node, standin) -> None:
    node, out = _run_rank_script(coordinator, standin_node, standin, "job-e", RANK_WITH_AN_ENGINE_CHILD)
    rank_pid, engine_pid = map(int, out.split()[-2:])

    (event,) = _events(node, "gpu_memory_not_freed")
    assert (event["pid"], event["rank_pid"], event["used_bytes"]) == (engine_pid, rank_pid, 4 << 30)
    (released,) = _events(node, "released")
    assert released["gpu_bytes"] == {str(rank_pid): 0, str(engine_pid): 4 << 30}

#!/usr/bin/env bash
# Two tiny veRL 0.9.1 GRPO jobs multiplexed by RollMux on ONE GPU of this machine, against each job
# run alone with RollMux off. Real CUDA, veRL's default engines (FSDP actor, vLLM rollout), none of the
# CPU harness patches. The model is a randomly initialised small Qwen2 written locally with the CPU
# harness's tokenizer and toy data builders (tests/adapters/verl/harness/assets.py): nothing is
# downloaded.
#
# Usage (from a source checkout):
#   examples/verl_gpu_smoke.sh            # GPU 0, or the first one in CUDA_VISIBLE_DEVICES
#   STEPS=4 OUT=/tmp/smoke CUDA_VISIBLE_DEVICES=3 examples/verl_gpu_smoke.sh
#
# Environment: PYTHON (default .venv/bin/python; needs a CUDA build of torch, verl==0.9.1 with vLLM,
# nvidia-ml-py and this repo installed, e.g. `pip install -e . 'verl[vllm]==0.9.1' nvidia-ml-py`),
# STEPS (training steps per job, default 3; the first is warm-up), OUT (logs; default a temp dir),
# GPU_MEM_UTIL (vLLM's share of the GPU per job, default 0.25: both jobs' engines fit on one GPU),
# GPU_MEM_LIMIT_MIB (GPU memory a job's processes may still hold when a sidecar releases its node,
# default 3072: the CUDA contexts of its trainer and vLLM processes and vLLM's graph pool stay, its
# weights, optimizer state and KV cache, several GiB at GPU_MEM_UTIL=0.25, must be gone).
#
# Prints: each job's mean veRL step time (timing_s/step after the first step) alone vs multiplexed,
# the peak GPU memory each job's processes held (sampled with the sidecar's own NVML query) and the
# sidecars' NVML memory check (nvml=yes, releases, gpu_memory_not_freed records). Exits 1 when there
# is no usable GPU, a job fails, a sidecar runs without NVML, NVML sees none of a job's processes (a
# container's PID namespace hides them, and the check would pass vacuously) or the memory check
# reported a leak.
set -euo pipefail

die() { echo "verl_gpu_smoke: $*" >&2; exit 1; }

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
STEPS=${STEPS:-3}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/rollmux-verl-gpu.XXXXXX")}
GPU_MEM_UTIL=${GPU_MEM_UTIL:-0.25}
GPU_MEM_LIMIT_MIB=${GPU_MEM_LIMIT_MIB:-3072}

[[ -x "$PY" ]] || die "no Python at $PY: set PYTHON to an interpreter with torch (CUDA), verl 0.9.1 and rollmux"
[[ "$STEPS" =~ ^[1-9][0-9]*$ ]] || die "STEPS must be a positive integer, got '$STEPS'"
[[ "$GPU_MEM_LIMIT_MIB" =~ ^[0-9]+$ ]] || die "GPU_MEM_LIMIT_MIB must be a whole number of MiB, got '$GPU_MEM_LIMIT_MIB'"
command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: run this on a machine with an NVIDIA GPU and driver"
nvidia-smi -L >/dev/null 2>&1 || die "nvidia-smi cannot reach the driver: $(nvidia-smi -L 2>&1 | head -n 1)"

# One GPU for both jobs: the first entry of CUDA_VISIBLE_DEVICES (an index or a GPU-/MIG- UUID), else 0.
if [[ -n "${CUDA_VISIBLE_DEVICES+x}" ]]; then
    GPU=${CUDA_VISIBLE_DEVICES%%,*}
    [[ -n "$GPU" && "$GPU" != "-1" ]] || die "CUDA_VISIBLE_DEVICES='$CUDA_VISIBLE_DEVICES' hides every GPU"
else
    GPU=0
fi
GPU_INFO=$(nvidia-smi --id="$GPU" --query-gpu=index,uuid,name,memory.total,memory.used \
    --format=csv,noheader 2>&1) || die "GPU '$GPU' not found by nvidia-smi (nvidia-smi -L lists them): $GPU_INFO"
export CUDA_VISIBLE_DEVICES=$GPU
echo "GPU: $GPU_INFO"

"$PY" - <<'PY' || die "the Python environment is not ready for a GPU run (see above)"
import importlib.util, sys
import torch
if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
    sys.exit(f"torch {torch.__version__} sees no CUDA device (torch.version.cuda={torch.version.cuda}): "
             "install a CUDA build of torch")
import verl
if verl.__version__ != "0.9.1":
    sys.exit(f"verl {verl.__version__} is installed: this smoke test is for verl 0.9.1")
missing = [m for m in ("vllm", "pynvml", "rollmux") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing modules {missing}: pip install 'verl[vllm]==0.9.1' nvidia-ml-py -e .")
print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}; verl {verl.__version__}")
PY

mkdir -p "$OUT"
echo "logs: $OUT"
export RMX_SMOKE_OUT=$OUT RMX_SMOKE_STEPS=$STEPS RMX_SMOKE_GPU_MEM_UTIL=$GPU_MEM_UTIL RMX_SMOKE_REPO=$REPO \
    RMX_SMOKE_MEM_LIMIT_MIB=$GPU_MEM_LIMIT_MIB
exec "$PY" - <<'PY'
import json, os, secrets, statistics, subprocess, sys, tempfile, threading, time
from pathlib import Path

REPO, OUT = Path(os.environ["RMX_SMOKE_REPO"]), Path(os.environ["RMX_SMOKE_OUT"]).resolve()
STEPS, MEM = int(os.environ["RMX_SMOKE_STEPS"]), os.environ["RMX_SMOKE_GPU_MEM_UTIL"]
MEM_LIMIT_MIB = os.environ["RMX_SMOKE_MEM_LIMIT_MIB"]
HARNESS = REPO / "tests" / "adapters" / "verl" / "harness"
sys.path.insert(0, str(HARNESS))
import scenario  # the harness's job runner and opt-in variables (nothing CPU-specific in them)
from assets import build_data, build_tokenizer
from job import read_jsonl, step_metrics

from rollmux.sidecar.gpu import detect


def build_assets(out: Path) -> Path:
    """The harness's tokenizer and data; a GPU-friendly tiny Qwen2 (head_dim 64, bf16) in place of its model."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    tok = AutoTokenizer.from_pretrained(out)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      bos_token_id=None, torch_dtype="bfloat16")
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).save_pretrained(out)
    build_data(out, train_rows=128)
    return out


class GpuJob:
    """One veRL GRPO job on the GPU with veRL's defaults (the interface harness.scenario.run uses)."""

    def __init__(self, name: str, assets: Path, workdir: Path, seed: int) -> None:
        self.name, self.assets, self.workdir, self.seed = name, assets, workdir, seed

    def ray_tmp(self) -> str:
        return os.path.join(tempfile.gettempdir(), f"rmxg-{self.name}")

    def command(self) -> list[str]:
        a = self.assets
        return [sys.executable, "-m", "verl.trainer.main_ppo", "algorithm.adv_estimator=grpo",
                f"data.train_files={a / 'train.parquet'}", f"data.val_files={a / 'test.parquet'}",
                "data.train_batch_size=16", "data.max_prompt_length=64", "data.max_response_length=64",
                f"data.seed={self.seed}", f"actor_rollout_ref.model.path={a}",
                "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.actor.use_kl_loss=False",
                "actor_rollout_ref.rollout.name=vllm",  # veRL 0.9.1 requires a choice; vLLM is its usual engine
                "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.n=4",
                f"actor_rollout_ref.rollout.gpu_memory_utilization={MEM}",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
                f"reward.custom_reward_function.path={HARNESS / 'toy_reward.py'}",
                "reward.custom_reward_function.name=compute_score",
                "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.logger=[console]",
                "trainer.project_name=rmx-gpu", f"trainer.experiment_name={self.name}",
                f"trainer.total_training_steps={STEPS}", "trainer.val_before_train=False", "trainer.test_freq=-1",
                "trainer.save_freq=-1", f"trainer.default_local_dir={self.workdir / 'ckpt'}"]

    def start(self, opt_in: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        self.workdir.mkdir(parents=True, exist_ok=True)
        os.makedirs(self.ray_tmp(), exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ROLLMUX_", "RMX_", "RAY_ADDRESS"))}
        env.update({"RAY_TMPDIR": self.ray_tmp(), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
                    "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **(opt_in or {})})
        with open(self.workdir / "job.log", "wb") as log:
            return subprocess.Popen(self.command(), cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)


def job_pids(job: GpuJob) -> list[int]:
    """Every process of the job (its own RAY_TMPDIR is in their environment)."""
    marker, out = f"RAY_TMPDIR={job.ray_tmp()}".encode(), []
    for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    out.append(pid)
        except OSError:
            continue
    return out


class MemorySampler(threading.Thread):
    """Peak GPU memory of each job's processes, through the sidecar's NVML provider, every 0.5 s."""

    def __init__(self, jobs: list[GpuJob]) -> None:
        super().__init__(daemon=True)
        self.jobs, self.peak, self.stop = jobs, {j.name: 0 for j in jobs}, threading.Event()
        self.gpu = detect("H100", 1)

    def run(self) -> None:
        while not self.stop.wait(0.5):
            for j in self.jobs:
                used = self.gpu.process_memory_bytes(job_pids(j))
                if used is not None:
                    self.peak[j.name] = max(self.peak[j.name], used)


def mean_step(job: GpuJob) -> float:
    m = step_metrics(job.workdir / "job.log")
    used = sorted(m)[1:] or sorted(m)
    if not used:
        sys.exit(f"{job.name}: veRL printed no step metrics; see {job.workdir / 'job.log'}")
    return statistics.fmean(m[s]["timing_s/step"] for s in used)


def run(label: str, pairs: list[tuple[GpuJob, dict[str, str] | None]]) -> dict[str, float]:
    print(f"{label} ...", flush=True)
    sampler = MemorySampler([j for j, _ in pairs])
    sampler.start()
    try:
        done = scenario.run(pairs, timeout_s=1800)
    finally:
        sampler.stop.set()
    for name, f in done.items():
        if f.rc != 0:
            sys.exit(f"{name} exited {f.rc}; see {f.job.workdir / 'job.log'}")
    for j, _ in pairs:
        print(f"  {j.name}: wall {done[j.name].wall_s:.1f} s, step {mean_step(j):.3f} s, "
              f"peak GPU memory {sampler.peak[j.name] / 2**30:.2f} GiB", flush=True)
        if sampler.peak[j.name] == 0:
            sys.exit(f"NVML reported no GPU memory for any process of {j.name}: it cannot see the job's PIDs "
                     "(run outside a separate PID namespace, e.g. docker --pid=host), so the memory check "
                     "would pass without checking anything")
    return {j.name: mean_step(j) for j, _ in pairs}


class Cluster:
    """Coordinator (embedded store) + a rollout-pool and a train-pool sidecar, both with NVML, on this GPU."""

    def __init__(self, root: Path) -> None:
        self.root, self.procs = root, []
        self.events, self.node_events = root / "phases.jsonl", root / "nodes.jsonl"
        self.sockets: dict[str, str] = {}

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with open(self.root / f"{name}.log", "wb") as log:
            p = subprocess.Popen([sys.executable, "-m", "rollmux", *argv], stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        self.procs.append(p)
        return p

    def wait_for(self, path: Path, what: str) -> None:
        deadline = time.monotonic() + 120
        while not path.exists():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                sys.exit(f"{what} did not come up; see the logs in {self.root}")
            time.sleep(0.1)

    def __enter__(self) -> "Cluster":
        self.root.mkdir(parents=True, exist_ok=True)
        secret = self.root / "secret"
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # owner-only from the start
        os.write(fd, secrets.token_hex(16).encode())
        os.close(fd)
        ports = self.root / "ports.json"
        self.spawn("coordinator", ["coordinator", "--embedded", "--listen", "127.0.0.1:0", "--http", "",
                                   "--secret-file", str(secret), "--port-file", str(ports), "--gpus-per-node", "1"])
        self.wait_for(ports, "the coordinator")
        address = f"127.0.0.1:{json.loads(ports.read_text())['grpc']}"
        sock_dir = Path(tempfile.mkdtemp(prefix="rmx-"))  # short: sun_path is 107 bytes
        for pool in ("rollout", "train"):
            self.sockets[pool] = str(sock_dir / f"{pool}.sock")
            self.spawn(f"{pool}-0", ["sidecar", "--coordinator", address, "--node-id", f"{pool}-0", "--pool", pool,
                                     "--socket", self.sockets[pool], "--secret-file", str(secret),
                                     "--gpu-mem-limit-mib", MEM_LIMIT_MIB,
                                     "--event-log", str(self.node_events), "--ready-file", str(self.root / pool)])
            self.wait_for(self.root / pool, f"the {pool} sidecar")
        return self

    def __exit__(self, *exc: object) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def memory_check(cluster: Cluster) -> bool:
    nvml = {pool: "nvml=yes" in (cluster.root / f"{pool}-0.log").read_text(errors="replace")
            for pool in ("rollout", "train")}
    recs = read_jsonl(cluster.node_events)
    released = sum(r.get("event") == "released" for r in recs)
    leaks = [r for r in recs if r.get("event") == "gpu_memory_not_freed"]
    print(f"NVML memory check (limit {MEM_LIMIT_MIB} MiB per job at release): sidecar NVML {nvml}; "
          f"{released} releases checked, "
          f"{len(leaks)} gpu_memory_not_freed records {leaks[:3]}")
    return all(nvml.values()) and released > 0 and not leaks


assets = build_assets(OUT / "assets")
a, b = (GpuJob(f"{n}-alone", assets, OUT / "alone" / n, seed) for n, seed in (("a", 0), ("b", 1)))
alone = {**run("job A alone, RollMux off", [(a, None)]), **run("job B alone, RollMux off", [(b, None)])}
with Cluster(OUT / "rollmux") as cluster:
    ma, mb = (GpuJob(f"{n}-mux", assets, OUT / "mux" / n, seed) for n, seed in (("a", 0), ("b", 1)))
    mux = run("jobs A and B multiplexed on one GPU", [(j, scenario.opt_in(cluster, j.name)) for j in (ma, mb)])
    ok = memory_check(cluster)
print(f"\n{'job':<6}{'alone s/step':>14}{'multiplexed s/step':>20}{'slowdown':>10}")
for n in ("a", "b"):
    s, m = alone[f"{n}-alone"], mux[f"{n}-mux"]
    print(f"{n:<6}{s:>14.3f}{m:>20.3f}{m / s:>9.2f}x")
sys.exit(0 if ok else 1)
PY

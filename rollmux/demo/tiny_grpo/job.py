"""Entry point of the tiny GRPO job: one trainer process and one rollout process, disaggregated.

Shipped inside the installed package (``rollmux demo`` runs it); from any directory::

    python -m rollmux.demo.tiny_grpo.job --iterations 40

Rank 0 is the trainer, rank 1 the rollout worker; they rendezvous over gloo on localhost. Each
iteration, in this order:

    trainer:  sync (send weights)   -> [wait for batch]           -> train
    rollout:  sync (receive weights) -> rollout (sample, score) -> [send batch]

The three phases are the functions :func:`sync`, :func:`rollout` and :func:`train`, each called inside
``phase_hook(<name>)``: a context-manager factory that defaults to a no-op. The RollMux shim gates the
phases by passing its own (``--phase-hook rollmux.shim:phase``-style ``module:attr``), resolved in
both processes. The trainer prints one JSON line per iteration (``--log-file`` to write a file).

Weights go trainer -> rollout every iteration by a direct gloo broadcast (default) or, with
``--sync plugin``, through ``rollmux.sync_plugin`` (two-stage send/receive; same bytes, same run).

``--device cuda`` runs both policies on the GPU (several jobs may share one). The collectives stay on
gloo, which moves CPU tensors only: weights and batches cross through host memory (a staging copy each
way), and sampling draws from a generator on the policy's device, so a CUDA run is correct but not
bitwise equal to a CPU run of the same seed.

Knobs: ``--group-size``, ``--prompts`` and ``--max-new-tokens`` make a job rollout-heavy;
``--train-epochs``, ``--minibatches`` and ``--d-model`` make it train-heavy. Measured on one contended CPU core per process (seconds per iteration,
rollout / train): ``--group-size 16 --max-new-tokens 16 --minibatches 1`` about 0.43 / 0.21;
``--group-size 4 --train-epochs 4 --minibatches 4 --d-model 128`` about 0.18 / 0.62.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TextIO

import torch
import torch.distributed as dist

from rollmux.core.ports import free_port
from rollmux.demo.tiny_grpo.grpo import group_advantages, grpo_loss
from rollmux.demo.tiny_grpo.model import Sample, TinyPolicy, sample, token_logp
from rollmux.demo.tiny_grpo.task import PROMPT_LEN, make_prompts, reward

PhaseHook = Callable[[str], AbstractContextManager[Any]]
"""``phase_hook("rollout"|"train"|"sync")`` returns a context manager wrapped around that phase."""

TRAINER, ROLLOUT = 0, 1


@dataclass(kw_only=True, slots=True)
class JobConfig:
    """Everything that defines a run; both processes receive the same copy."""

    job_id: str = "tiny-grpo"
    """Name in the log lines."""
    iterations: int = 40
    """Training iterations (each: sync, rollout, train)."""
    prompts: int = 16
    """Prompts per iteration."""
    group_size: int = 8
    """Samples per prompt (GRPO group); rollout cost grows with prompts * group_size."""
    max_new_tokens: int = 12
    """Response length limit; longer makes rollouts (and their tail) longer."""
    max_count: int = 6
    """Largest count k in a prompt (target length)."""
    d_model: int = 64
    """Policy width."""
    n_layers: int = 2
    """Policy depth."""
    n_heads: int = 4
    """Attention heads."""
    lr: float = 3e-3
    """Adam learning rate."""
    clip_eps: float = 0.2
    """PPO clip range."""
    kl_coef: float = 0.0
    """KL penalty to the initial policy (0 disables it and the reference model)."""
    train_epochs: int = 1
    """Passes over each batch; more makes the job train-heavy."""
    minibatches: int = 2
    """Optimizer steps per epoch."""
    seed: int = 0
    """Seeds model init, prompts and sampling."""
    threads: int = 1
    """torch intra-op threads per process."""
    device: str = "cpu"
    """Where both policies run: "cpu" or a CUDA device ("cuda", "cuda:1")."""
    sync: str = "broadcast"
    """Weight transport: "broadcast" (direct gloo broadcast) or "plugin" (rollmux.sync_plugin)."""
    phase_hook: str | None = None
    """``module:attr`` of a phase-hook factory, resolved in each process; None means no-op."""
    log_file: str | None = None
    """Write JSON lines here instead of stdout."""

    def __post_init__(self) -> None:
        for name in ("iterations", "prompts", "max_new_tokens", "max_count", "train_epochs", "minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if self.group_size < 2:
            raise ValueError(
                f"group_size={self.group_size} must be at least 2 (advantages are group-relative)"
            )
        if self.max_count > 9:
            raise ValueError(f"max_count={self.max_count} must be at most 9 (a count is one digit token)")
        if self.sync not in ("broadcast", "plugin"):
            raise ValueError(f"sync={self.sync!r} must be 'broadcast' or 'plugin'")
        if self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r} must be 'cpu' or a CUDA device ('cuda', 'cuda:1')")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be a multiple of n_heads={self.n_heads}")


# ------------------------------------------------------------------------------------------ phases


def sync(
    policy: TinyPolicy, *, src: int = TRAINER, group: Any = None, plugin: PluginSync | None = None
) -> int:
    """Copy the trainer's weights into the rollout's policy. Called by both processes.

    Default: one flat gloo broadcast from ``src``. With ``plugin`` (``--sync plugin``) the weights go
    through ``rollmux.sync_plugin``'s two-stage send/receive instead; this function is the one seam to
    swap the transport.

    Returns:
        Bytes moved.
    """
    if plugin is not None:
        return plugin(policy)
    params = list(policy.parameters())
    flat = torch.nn.utils.parameters_to_vector(params).detach().cpu()  # gloo moves host tensors
    dist.broadcast(flat, src=src, group=group)
    if dist.get_rank() != src:
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(flat.to(params[0].device), params)
    return flat.numel() * flat.element_size()


class PluginSync:
    """Weight sync through ``rollmux.sync_plugin`` (trainer rank 0 sends, rollout rank 1 receives).

    Construction is collective (creates the groups, checks both sides hold the same parameter list
    and plans the transfer once); each call then moves the weights bitwise into the live parameters.
    """

    def __init__(self, policy: TinyPolicy) -> None:
        from rollmux.sync_plugin import (
            SyncTopology,
            create_groups,
            exchange_metadata,
            param_metadata,
            plan_transfer,
        )

        topology = SyncTopology(trainer_ranks=(TRAINER,), rollout_ranks=(ROLLOUT,))
        self.groups = create_groups(topology)
        metadata = param_metadata(list(policy.named_parameters()))
        exchange_metadata(metadata, topology)
        self.plan = plan_transfer(topology, metadata)

    def __call__(self, policy: TinyPolicy) -> int:
        from rollmux.sync_plugin import receive, send

        tensors = [p.detach() for p in policy.parameters()]  # same storage, outside autograd
        host = [t.cpu() for t in tensors]  # gloo moves host tensors; the same tensors on a CPU run
        if dist.get_rank() == TRAINER:
            send(host, self.plan, self.groups)
        else:
            receive(host, self.plan, self.groups)
            for t, h in zip(tensors, host):
                if h is not t:
                    t.copy_(h)
        return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True, slots=True)
class RolloutBatch:
    """What the rollout process hands the trainer."""

    sample: Sample  # tokens, response mask, sampling log-probs
    rewards: torch.Tensor  # [B] float32, group by group

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The same batch on `device` (itself when already there)."""
        s = self.sample
        return RolloutBatch(Sample(s.tokens.to(device), s.response_mask.to(device), s.old_logp.to(device)),
                            self.rewards.to(device))


def rollout(policy: TinyPolicy, cfg: JobConfig, iteration: int) -> RolloutBatch:
    """Sample ``group_size`` responses for each of ``prompts`` fresh prompts and score them.

    The batch is on the policy's device, its rewards on the host.
    """
    seed = cfg.seed * 100_003 + iteration
    gen = torch.Generator().manual_seed(seed)
    prompts = make_prompts(cfg.prompts, cfg.max_count, gen).repeat_interleave(cfg.group_size, dim=0)
    device = next(policy.parameters()).device
    # CPU: one generator for prompts and samples (the run every seed-pinned figure comes from).
    draw = gen if device.type == "cpu" else torch.Generator(device=device).manual_seed(seed)
    out = sample(policy, prompts.to(device), cfg.max_new_tokens, draw)
    rewards = torch.tensor(
        [reward(p.tolist(), r.tolist()) for p, r in zip(prompts, out.tokens[:, PROMPT_LEN:].cpu())],
        dtype=torch.float32,
    )
    return RolloutBatch(out, rewards)


def train(
    policy: TinyPolicy,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    cfg: JobConfig,
    reference: TinyPolicy | None = None,
) -> float:
    """GRPO update on one batch: ``train_epochs`` passes of ``minibatches`` optimizer steps.

    Returns:
        Mean loss over the steps.
    """
    s = batch.sample
    adv = group_advantages(batch.rewards.to(s.tokens.device), cfg.group_size)
    ref_logp = None
    if reference is not None:
        with torch.no_grad():
            ref_logp = token_logp(reference, s.tokens, PROMPT_LEN)
    gen = torch.Generator().manual_seed(cfg.seed)
    losses = []
    for _ in range(cfg.train_epochs):
        for idx in torch.randperm(len(adv), generator=gen).chunk(cfg.minibatches):
            logp = token_logp(policy, s.tokens[idx], PROMPT_LEN)
            loss = grpo_loss(
                logp,
                s.old_logp[idx],
                adv[idx],
                s.response_mask[idx],
                clip_eps=cfg.clip_eps,
                ref_logp=None if ref_logp is None else ref_logp[idx],
                kl_coef=cfg.kl_coef,
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
    return sum(losses) / len(losses)


# ------------------------------------------------------------------------------- batch transport


def send_batch(batch: RolloutBatch, stats: list[float], dst: int) -> None:
    """Ship a rollout batch and the rollout's numbers (``[sync_s, rollout_s]``) over gloo (host tensors)."""
    s = batch.to("cpu").sample
    dist.send(torch.tensor([*s.tokens.shape, s.response_mask.shape[1]], dtype=torch.int64), dst)
    dist.send(s.tokens, dst)
    dist.send(torch.cat([s.response_mask, s.old_logp], dim=1), dst)
    dist.send(batch.rewards.cpu(), dst)
    dist.send(torch.tensor(stats, dtype=torch.float64), dst)


def recv_batch(src: int) -> tuple[RolloutBatch, list[float]]:
    """Receive what :func:`send_batch` sent."""
    shape = torch.empty(3, dtype=torch.int64)
    dist.recv(shape, src)
    rows, length, resp = (int(v) for v in shape)
    tokens = torch.empty(rows, length, dtype=torch.int64)
    dist.recv(tokens, src)
    mask_logp = torch.empty(rows, 2 * resp, dtype=torch.float32)
    dist.recv(mask_logp, src)
    rewards = torch.empty(rows, dtype=torch.float32)
    dist.recv(rewards, src)
    stats = torch.empty(2, dtype=torch.float64)
    dist.recv(stats, src)
    mask, old_logp = mask_logp.split(resp, dim=1)
    return RolloutBatch(Sample(tokens, mask.contiguous(), old_logp.contiguous()), rewards), stats.tolist()


# -------------------------------------------------------------------------------------- processes


@contextlib.contextmanager
def no_phase_hook(name: str) -> Iterator[None]:
    """The default phase hook: does nothing."""
    yield


def resolve_phase_hook(spec: str | None) -> PhaseHook:
    """Import ``module:attr`` (None gives :func:`no_phase_hook`)."""
    if not spec:
        return no_phase_hook
    module, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"phase hook {spec!r} must look like 'package.module:factory'")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def build_policy(cfg: JobConfig) -> TinyPolicy:
    """The same initial policy in both processes (seeded on the host, then moved to ``cfg.device``)."""
    torch.manual_seed(cfg.seed)
    return TinyPolicy(
        max_len=PROMPT_LEN + cfg.max_new_tokens,
        d_model=cfg.d_model,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
    ).to(cfg.device)


def trainer_main(cfg: JobConfig, hook: PhaseHook, out: TextIO) -> None:
    """Rank 0: sync, wait for the batch, train; log one JSON line per iteration."""
    policy = build_policy(cfg)
    reference = copy.deepcopy(policy).requires_grad_(False) if cfg.kl_coef > 0 else None
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    plugin = PluginSync(policy) if cfg.sync == "plugin" else None
    start = time.perf_counter()
    for it in range(cfg.iterations):
        t0 = time.perf_counter()
        with hook("sync"):
            sync(policy, plugin=plugin)
        t1 = time.perf_counter()
        batch, (_, rollout_s) = recv_batch(ROLLOUT)
        batch = batch.to(cfg.device)
        t2 = time.perf_counter()
        with hook("train"):
            loss = train(policy, optimizer, batch, cfg, reference)
        t3 = time.perf_counter()
        lengths = batch.sample.response_mask.sum(dim=1).cpu()
        record = {
            "job": cfg.job_id,
            "iteration": it,
            "phase_s": {
                "sync": round(t1 - t0, 6),
                "rollout": round(rollout_s, 6),
                "train": round(t3 - t2, 6),
            },
            "wait_s": round(t2 - t1 - rollout_s, 6),
            "reward_mean": round(float(batch.rewards.mean()), 6),
            "resp_len_mean": round(float(lengths.mean()), 3),
            "resp_len_max": int(lengths.max()),
            "loss": round(loss, 6),
            "elapsed_s": round(t3 - start, 6),
        }
        out.write(json.dumps(record) + "\n")
        out.flush()


def rollout_main(cfg: JobConfig, hook: PhaseHook) -> None:
    """Rank 1: sync, rollout, ship the batch."""
    policy = build_policy(cfg)
    policy.eval()
    plugin = PluginSync(policy) if cfg.sync == "plugin" else None
    for it in range(cfg.iterations):
        t0 = time.perf_counter()
        with hook("sync"):
            sync(policy, plugin=plugin)
        t1 = time.perf_counter()
        with hook("rollout"):
            batch = rollout(policy, cfg, it)
        t2 = time.perf_counter()
        send_batch(batch, [t1 - t0, t2 - t1], TRAINER)


def _process(rank: int, cfg: JobConfig, init_method: str) -> None:
    torch.set_num_threads(cfg.threads)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=2)
    hook = resolve_phase_hook(cfg.phase_hook)
    try:
        if rank == TRAINER:
            if cfg.log_file:
                with open(cfg.log_file, "a", encoding="utf-8") as out:
                    trainer_main(cfg, hook, out)
            else:
                trainer_main(cfg, hook, sys.stdout)
        else:
            rollout_main(cfg, hook)
    finally:
        dist.destroy_process_group()


def run_job(cfg: JobConfig) -> None:
    """Start the trainer and rollout processes and wait for both.

    Raises:
        RuntimeError: a process exited with a non-zero code.
    """
    import multiprocessing as mp

    init_method = f"tcp://127.0.0.1:{free_port()}"
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_process, args=(rank, cfg, init_method), name=f"{cfg.job_id}-{role}")
        for rank, role in ((TRAINER, "trainer"), (ROLLOUT, "rollout"))
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    failed = [f"{p.name} (exit {p.exitcode})" for p in procs if p.exitcode]
    if failed:
        for p in procs:
            if p.is_alive():
                p.terminate()
        raise RuntimeError(
            f"tiny GRPO job {cfg.job_id!r}: {', '.join(failed)} failed; see its traceback above"
        )


def parse_args(argv: list[str] | None = None) -> JobConfig:
    """Build a :class:`JobConfig` from the command line (one flag per field)."""
    parser = argparse.ArgumentParser(
        prog="python -m rollmux.demo.tiny_grpo.job",
        description="Tiny disaggregated GRPO job (trainer + rollout process, gloo weight sync).",
    )
    for f in dataclasses.fields(JobConfig):
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        kind = {"int": int, "float": float}.get(str(f.type), str)
        parser.add_argument(flag, type=kind, default=default, help=f"(default: {default})")
    return JobConfig(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    run_job(parse_args(argv))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())

"""``hf_cpu``: a rollout replica for veRL on CPU (test harness; stands in for vLLM / SGLang).

* :class:`HFCPUServer`, one Ray actor per replica, holds an HF copy of the model and implements
  the token-in/token-out ``generate`` veRL's ``LLMServerClient`` calls, with per-token log-probs;
  greedy when ``top_k == 1`` (log-probs still at temperature 1, as the trainer computes them).
* :class:`HFCPUServerAdapter`, the trainer-side ``BaseRollout``: ``update_weights`` loads the
  trainer's full tensors into the server (on the replica's first rank).
* :class:`HFCPUReplica`: starts the server and exposes it to veRL's router and load balancer.
"""

from __future__ import annotations

import asyncio
import os
import time
import zlib
from typing import Any

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from rollmux_verl_cpu import event, node_label
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput


def _server_name(replica_rank: int) -> str:
    return f"hf_cpu_server_{replica_rank}"


class HFCPUServer:
    """The replica's generation server (a Ray actor; generates one request at a time)."""

    def __init__(self, model_path: str, seed: int = 0) -> None:
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32,
                                                          attn_implementation="eager").eval()
        self.eos = self.model.generation_config.eos_token_id or self.model.config.eos_token_id
        self.seed = seed
        self.global_steps: int | None = None
        self.lock = asyncio.Lock()
        self.open = asyncio.Event()  # cleared by abort_all_requests: new requests wait, as vLLM parks them
        self.open.set()
        event("server.init", node=node_label())
        # a GPU process of the job: a rank on its node's sidecar, as the adapter makes vLLMHttpServer one
        from rollmux.adapters.common.ranks import attach_here

        attach_here(type(self).__name__)

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **_: Any) -> TokenOutput:
        await self.open.wait()
        async with self.lock:
            start = time.time()
            out = await asyncio.to_thread(self._generate, list(prompt_ids), dict(sampling_params))
            event("server.generate", start=start, end=time.time())
            return out

    def _generate(self, prompt_ids: list[int], params: dict[str, Any]) -> TokenOutput:
        max_new = int(params.get("max_tokens") or params.get("max_new_tokens") or 8)
        temperature = float(params.get("temperature", 1.0))
        greedy = temperature == 0 or int(params.get("top_k", -1)) == 1
        gen = torch.Generator().manual_seed(self._request_seed(prompt_ids))
        ids = torch.tensor([prompt_ids])
        out_ids: list[int] = []
        logps: list[float] = []
        past = None
        with torch.no_grad():
            for _ in range(max_new):
                res = self.model(input_ids=ids if past is None else ids[:, -1:], past_key_values=past, use_cache=True)
                past = res.past_key_values
                logits = res.logits[0, -1].float()
                scaled = logits / (temperature if temperature > 0 else 1.0)
                logprobs = torch.log_softmax(scaled, dim=-1)
                tok = int(torch.argmax(logits)) if greedy else int(torch.multinomial(logprobs.exp(), 1, generator=gen))
                out_ids.append(tok)
                logps.append(float(logprobs[tok]))
                ids = torch.cat([ids, torch.tensor([[tok]])], dim=1)
                if tok == self.eos:
                    break
        return TokenOutput(token_ids=out_ids, log_probs=logps, stop_reason="completed",
                           extra_fields={"global_steps": self.global_steps})

    def _request_seed(self, prompt_ids: list[int]) -> int:
        """A sample's seed from what the request is (the prompt, the weights' step), not from which replica
        serves it or in what order: a job's samples stay the same however the load balancer routes them."""
        key = torch.tensor(prompt_ids, dtype=torch.int64).numpy().tobytes()
        return (self.seed * 1_000_003 + (self.global_steps or 0) * 7_919 + zlib.crc32(key)) % 2**63

    def load_weights(self, state: dict[str, torch.Tensor], global_steps: int | None) -> None:
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected:
            raise RuntimeError(f"hf_cpu server: unexpected weights {unexpected[:3]}")
        self.global_steps = global_steps
        event("server.load_weights", global_steps=global_steps, tensors=len(state))

    def wake_up(self) -> None:
        event("server.wake_up")

    def sleep(self) -> None:
        event("server.sleep")

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        """Close the gate and wait for the request in flight (ours finish instead of being cut short)."""
        self.open.clear()
        async with self.lock:
            event("server.abort")

    async def resume_generation(self) -> None:
        self.open.set()
        event("server.resume")

    def clear_kv_cache(self) -> None:
        return None

    def release_kv_cache(self) -> None:
        return None

    def resume_kv_cache(self) -> None:
        return None

    def start_profile(self, **_: Any) -> None:
        return None

    def stop_profile(self) -> None:
        return None

    def pid(self) -> int:
        return os.getpid()


class HFCPUServerAdapter(BaseRollout):
    """The trainer worker's handle on its replica's server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        world = self.config.tensor_model_parallel_size * self.config.data_parallel_size
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.leader = rank % world == 0

    async def resume(self, tags: list[str]) -> None:
        event("adapter.resume", tags=list(tags))  # what vLLM would map back onto the GPU (weights, kv_cache)

    async def release(self) -> None:
        return None

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        state = {name: t.detach().to("cpu", copy=True) for name, t in weights}
        event("worker.update_weights", node=node_label(), global_steps=kwargs.get("global_steps"))
        if self.leader:
            server = ray.get_actor(_server_name(self.replica_rank))
            await server.load_weights.remote(state, kwargs.get("global_steps"))


class HFCPUReplica(RolloutReplica):
    """One ``hf_cpu`` server per replica, started on the node of the replica's trainer workers."""

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self) -> None:
        path = getattr(self.model_config, "local_path", None) or self.model_config.path
        options: dict[str, Any] = {"name": _server_name(self.replica_rank), "num_cpus": 0,
                                   "max_concurrency": self.max_concurrency}
        if self.workers:  # on its workers' node, as vLLMReplica pins its servers (a multi-node job)
            node = await self.workers[0].__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id())
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        server = ray.remote(HFCPUServer).options(**options).remote(path, int(getattr(self.config, "seed", 0) or 0))
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"hf-cpu-{self.replica_rank}"
        await server.pid.remote()

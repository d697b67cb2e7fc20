"""``rollmux.register_state`` reserves the host buffers at registration, so the first offload of a phase
(the critical path) allocates and pins nothing."""

from __future__ import annotations

import pytest

from rollmux.shim import api as shim
from rollmux.shim.runtime import Runtime

torch = pytest.importorskip("torch")


def test_register_state_reserves_what_the_first_offload_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    rt = Runtime(socket="unused", job="job", token="t", rank=0, timeout_s=1.0, event_log=None, client=None,
                 events=None, rank_id="r0", node_id="n0", pool="train")
    monkeypatch.setattr(shim, "_runtime", rt)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 64))
    class SelfRegisteringAdamW(torch.optim.AdamW):  # what a launcher's wrapper looks like (rollmux_rank)
        pass

    opt = SelfRegisteringAdamW(model.parameters())
    shim.register_state(model, opt, name="policy")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert rt.cache.host_bytes() >= 4 * params  # weights, gradients and AdamW's two moments, before any step
    allocations = rt.cache.host_allocations
    model(torch.randn(3, 256)).sum().backward()
    opt.step()
    rt.cache.offload()
    assert rt.cache.host_allocations == allocations
    rt.cache.reload()

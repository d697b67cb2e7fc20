"""The pipeline-config guard: what the adapter refuses before registering a ROLL job."""

from __future__ import annotations

from types import SimpleNamespace as NS
from typing import Any

import pytest

from rollmux.adapters.common.api import AdapterError
from rollmux.adapters.roll import driver


def _cfg(train: list[int], infer: list[int], **extra: Any) -> Any:
    return NS(actor_train=NS(device_mapping=train), actor_infer=NS(device_mapping=infer), **extra)


def test_agentic_default_partial_gpu_flag_with_colocated_devices_is_accepted() -> None:
    driver._check_config(_cfg([0], [0], partial_gpu_mode=True))  # AgenticConfig's default flag
    driver._check_config(_cfg([0], [1], partial_gpu_mode=True))  # disaggregated: no partial mode either


def test_partial_gpu_mode_and_async_generation_are_refused_with_a_remedy() -> None:
    with pytest.raises(AdapterError, match="partial_gpu_mode.*ROLLMUX_SIDECAR_SOCKET"):
        driver._check_config(_cfg([0], [0, 1], partial_gpu_mode=True))
    with pytest.raises(AdapterError, match="async_generation_ratio"):
        driver._check_config(_cfg([0], [0], async_generation_ratio=0.5))

"""Which GPU type a node registers: ``--gpu-type`` wins over NVML's device name, and a device outside the
catalog stops the sidecar with one line instead of a refused registration. NVML is a stand-in here (no
GPU on this machine): a module with pynvml's functions, answering for one named device."""

from __future__ import annotations

import sys
import types

import pytest

from rollmux.core.errors import ErrorCode
from rollmux.sidecar.gpu import NoGpuProvider, NvmlProvider, UnknownGpuError, detect


def _standin_pynvml(name: str, count: int = 1) -> types.ModuleType:
    """A stand-in for the ``pynvml`` module (nvidia-ml-py) that sees `count` devices called `name`."""
    m = types.ModuleType("pynvml")
    m.nvmlInit = lambda: None  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = lambda: count  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    m.nvmlDeviceGetName = lambda h: name  # type: ignore[attr-defined]
    m.nvmlSystemGetDriverVersion = lambda: "580.65"  # type: ignore[attr-defined]
    return m


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    def install(name: str, count: int = 1) -> None:
        monkeypatch.setitem(sys.modules, "pynvml", _standin_pynvml(name, count))

    return install


def test_nvml_name_maps_to_its_catalog_key(nvml) -> None:  # type: ignore[no-untyped-def]
    nvml("NVIDIA H200", 8)
    provider = detect("H800", 1)
    assert isinstance(provider, NvmlProvider)
    assert (provider.facts().gpu_type, provider.facts().gpu_count) == ("H200", 8)


def test_gpu_type_flag_wins_over_nvml(nvml) -> None:  # type: ignore[no-untyped-def]
    nvml("NVIDIA H100 80GB HBM3")
    assert detect("H800", 1, gpu_type_given=True).facts().gpu_type == "H800"
    assert detect("H800", 1).facts().gpu_type == "H100"  # the pool's default does not override NVML


def test_gpu_outside_the_catalog_needs_the_flag(nvml) -> None:  # type: ignore[no-untyped-def]
    nvml("NVIDIA GH200 480GB")
    with pytest.raises(UnknownGpuError, match="GH200.*--gpu-type") as err:
        detect("H20", 1)
    assert err.value.code is ErrorCode.INVALID_ARGUMENT
    assert detect("H200", 1, gpu_type_given=True).facts().gpu_type == "H200"


def test_nvml_off_or_absent_uses_the_flags(nvml, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    nvml("NVIDIA GH200 480GB")
    assert isinstance(detect("H20", 2, use_nvml=False), NoGpuProvider)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails: nvidia-ml-py not installed
    provider = detect("H20", 2)
    assert isinstance(provider, NoGpuProvider) and provider.facts().gpu_count == 2


def test_sidecar_stops_at_start_naming_the_flag(nvml, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from rollmux.sidecar import cli

    nvml("NVIDIA GH200 480GB")
    parser = __import__("argparse").ArgumentParser()
    cli.configure(parser)
    args = parser.parse_args(["--pool", "train", "--coordinator", "127.0.0.1:1", "--socket", "/tmp/rmx-gd.sock"])
    assert cli.run(args) == 2
    assert "not in the GPU catalog" in capsys.readouterr().err

from __future__ import annotations

import pytest

from rollmux.core.errors import SpecError
from rollmux.core.model import TB, ClusterSpec, GpuCatalog, JobSpec, Node, Pool
from rollmux.testing.builders import make_job


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"n_rollout_gpus": 0}, "n_rollout_gpus"),
        ({"n_train_gpus": -8}, "n_train_gpus"),
        ({"slo": 0.9}, "slo"),
        ({"slo": "fast"}, "slo"),
        ({"t_roll_s": float("nan")}, "t_roll_s"),
        ({"t_train_s": -1.0}, "t_train_s"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"rollout_state_bytes": -1}, "rollout_state_bytes"),
        ({"name": ""}, "name"),
    ],
    ids=["zero-rollout-gpus", "negative-train-gpus", "slo-below-1", "slo-not-numeric", "nan-time",
         "negative-time", "fractional-tokens", "negative-state", "empty-name"],
)
def test_bad_job_spec_names_field_and_range(fields: dict, names: str) -> None:
    base = {"name": "j", "n_rollout_gpus": 8, "n_train_gpus": 8}
    with pytest.raises(SpecError, match=names) as err:
        JobSpec(**(base | fields))
    assert "expected" in str(err.value)


def test_state_larger_than_node_dram_is_rejected() -> None:
    job = make_job(roll_gb=2100)
    with pytest.raises(SpecError, match="rollout_state_bytes.*exceeds a node's host DRAM"):
        job.validate_for(ClusterSpec(host_dram_bytes=2 * TB))


def test_unknown_gpu_type_lists_known_ones() -> None:
    with pytest.raises(SpecError, match="'B300' is not in the GPU catalog.*H20"):
        ClusterSpec(rollout_gpu="B300")


def test_catalog_defaults_are_the_papers_table1() -> None:
    cat = GpuCatalog.default()
    assert (cat["H20"].tflops, cat["H20"].hbm_gb, cat["H20"].hbm_tb_s, cat["H20"].usd_per_gpu_h) == (148, 96, 4.0, 1.85)
    assert (cat["H800"].tflops, cat["H800"].usd_per_gpu_h) == (989.5, 5.28)
    assert {"H100", "H200", "A100", "L40S"} <= set(cat.gpus)


def test_catalog_yaml_overrides_and_extends(tmp_path) -> None:
    f = tmp_path / "gpus.yaml"
    f.write_text("gpus:\n  H20: {usd_per_gpu_h: 1.5}\n  B200: {tflops: 2250, hbm_gb: 192, hbm_tb_s: 8, usd_per_gpu_h: 7}\n")
    cat = GpuCatalog.from_yaml(f)
    assert cat["H20"].usd_per_gpu_h == 1.5 and cat["H20"].tflops == 148
    assert cat["B200"].hbm_gb == 192


def test_catalog_yaml_rejects_unknown_field(tmp_path) -> None:
    f = tmp_path / "gpus.yaml"
    f.write_text("gpus:\n  H20: {price: 1.5}\n")
    with pytest.raises(SpecError, match="unknown fields \\['price'\\]"):
        GpuCatalog.from_yaml(f)


def test_node_validation() -> None:
    with pytest.raises(SpecError, match="gpu_count"):
        Node(node_id="n0", pool=Pool.ROLLOUT, gpu_type="H20", gpu_count=0)


def test_cluster_prices_whole_nodes() -> None:
    c = ClusterSpec()
    assert c.node_usd_per_h(Pool.ROLLOUT) == pytest.approx(8 * 1.85)
    assert c.nodes_for(9) == 2 and c.nodes_for(8) == 1

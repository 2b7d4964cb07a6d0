"""The device catalog: every device the planner must know, with figures consistent with its architecture."""
import pytest

from verl.compat.device.catalog import ALIASES, CATALOG, get_profile

REQUIRED = ["cpu", "p40", "p100", "v100-16gb", "v100-32gb", "t4", "rtx2080ti", "rtx3090", "rtx4090", "a10",
            "l4", "a100-40gb", "a100-80gb", "l40s", "h100", "h200", "mi300x"]
# opt-in shared memory per block (KB) by NVIDIA architecture, CUDA programming guide
SMEM_KB = {(6, 0): 48, (6, 1): 48, (7, 0): 96, (7, 5): 64, (8, 0): 163, (8, 6): 99, (8, 9): 99, (9, 0): 227}


def test_required_devices_present():
    assert set(REQUIRED) <= set(CATALOG)
    for name, prof in CATALOG.items():
        assert prof.name == name


@pytest.mark.parametrize("name", [n for n in REQUIRED if n not in ("cpu", "mi300x")])
def test_nvidia_flags_follow_compute_capability(name):
    p = CATALOG[name]
    assert p.backend == "cuda"
    cc = p.compute_capability
    assert p.native_bf16 == (cc >= (8, 0))
    assert p.tensor_core_fp16 == (cc >= (7, 0))
    assert p.tf32 == (cc >= (8, 0))
    assert p.shared_mem_per_block_kb == SMEM_KB[cc]
    assert (p.bf16_tflops > 0) == p.native_bf16
    assert p.memory_gb > 8 and p.sm_count > 0 and p.bandwidth_gbps > 0 and p.fp32_tflops > 0
    if p.tensor_core_fp16:
        assert p.fp16_tflops >= 1.9 * p.fp32_tflops    # tensor cores (GeForce: half rate with fp32 accumulate)


def test_pascal_figures():
    p40, p100 = CATALOG["p40"], CATALOG["p100"]
    assert p40.compute_capability == (6, 1) and p100.compute_capability == (6, 0)
    assert p40.fp16_tflops < p40.fp32_tflops / 32      # fp16 at 1/64 rate: unusable
    assert 23 < p40.memory_gb < 24.5 and p40.sm_count == 30 and p40.shared_mem_per_block_kb == 48


def test_spec_sheet_spot_checks():
    assert CATALOG["a100-40gb"].bf16_tflops == 312 and CATALOG["a100-80gb"].bandwidth_gbps == 2039
    assert CATALOG["h100"].sm_count == 132 and CATALOG["h200"].bandwidth_gbps == 4800
    assert CATALOG["t4"].fp16_tflops == 65 and CATALOG["v100-32gb"].fp16_tflops == 125
    assert CATALOG["h200"].memory_gb > 135


def test_mi300x_is_rocm_with_native_bf16():
    p = CATALOG["mi300x"]
    assert p.backend == "rocm" and p.native_bf16 and p.tensor_core_fp16 and p.memory_gb > 180


def test_cpu_profile():
    p = CATALOG["cpu"]
    assert p.backend == "cpu" and p.compute_capability is None
    assert not (p.native_bf16 or p.tensor_core_fp16 or p.tf32)


@pytest.mark.parametrize("alias,target", sorted(ALIASES.items()))
def test_aliases_resolve(alias, target):
    assert get_profile(alias) is CATALOG[target]


def test_lookup_is_forgiving_about_case_and_separators():
    assert get_profile("A100_40GB") is CATALOG["a100-40gb"]
    assert get_profile(" Tesla P40 ") is CATALOG["p40"]


def test_unknown_name_lists_valid_names_and_closest_match():
    with pytest.raises(ValueError) as err:
        get_profile("p4")
    msg = str(err.value)
    assert "Did you mean 'p40'" in msg
    for name in REQUIRED:
        assert name in msg

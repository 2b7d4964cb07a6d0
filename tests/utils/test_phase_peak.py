"""fsdp_utils.phase_peak: each worker call's own allocator peak, while the run-long peak metrics keep
upstream's meaning (the peak since the process started)."""
import pytest
import torch

from verl.utils import fsdp_utils


def test_on_cpu_no_phase_peak_is_claimed():
    """There is no device allocator on CPU: the phase records nothing rather than a host figure."""
    with fsdp_utils.phase_peak("cpu", "update_actor") as metrics:
        torch.ones(1000)
    assert metrics == {}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_phase_peaks_are_per_call_and_the_run_peak_survives_the_resets():
    gib = 1024**3
    with fsdp_utils.phase_peak("cuda", "big") as big:
        x = torch.empty(gib // 2, dtype=torch.uint8, device="cuda")
        del x
    with fsdp_utils.phase_peak("cuda", "small") as small:
        y = torch.empty(gib // 8, dtype=torch.uint8, device="cuda")
        del y
    assert big["perf/max_memory_allocated_gb/big"] >= 0.5
    assert 0.125 <= small["perf/max_memory_allocated_gb/small"] < 0.5
    assert fsdp_utils.memory_metrics("cuda")["perf/max_memory_allocated_gb"] >= 0.5

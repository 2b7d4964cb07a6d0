"""benchmarks/profile_step.py off the GPU: the CPU smoke run profiles every phase of a step on the real
workers, and the device-trace summary (what the H200 run reports) adds up kernels correctly."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("profile_step", ROOT / "benchmarks" / "profile_step.py")
ps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ps)


def test_cpu_smoke_profiles_every_phase(tmp_path, capsys):
    """PPO with the KL penalty in the reward runs all six phases (critic and reference policy both); a
    variant's overrides reach the plan."""
    rc = ps.main(["--tiny", "--profiles", "cpu", "--settings", "quickstart", "--override",
                  "algorithm.use_kl_in_reward=True", "--variant",
                  "ckpt=actor_rollout_ref.model.enable_gradient_checkpointing=True", "--profile-decode-steps", "4",
                  "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    report = json.loads((tmp_path / "profile_step.json").read_text())
    (case,) = report["cases"]
    assert case["variant"] == "ckpt" and case["plan"]["actor"]["gradient_checkpointing"] is True
    assert case["plan"]["reasons"]["actor.gradient_checkpointing"] == "set by the user"
    assert case["plan"]["critic"]["gradient_checkpointing"] is False          # left to the fit: it fits without
    assert set(case["phases"]) == set(ps.PHASES)
    for phase, entry in case["phases"].items():
        prof = entry["profiled"]
        assert entry["wall_s"] > 0 and prof["wall_s"] > 0 and entry["first_s"] > 0, phase
        assert set(prof["families_s"]) == set(ps.FAMILIES)
        assert prof["families_s"]["gemm"] > 0 and sum(prof["families_s"].values()) == pytest.approx(
            prof["device_busy_s"], abs=1e-3), phase
        assert 0 <= prof["device_idle_fraction"] < 1 and prof["host_ops"] > 0, phase
    # scoring and updates were profiled on one mini-batch (2 of the 4 rows), generate on 4 of 8 new tokens
    assert "2 of 4 rows: one optimizer step" in case["phases"]["update_actor"]["profiled"]["what"]
    assert "2 of 4 rows" in case["phases"]["compute_values"]["profiled"]["what"]
    assert "4 of 8 decode steps" in case["phases"]["generate_sequences"]["profiled"]["what"]
    names = {p.name for p in (tmp_path / "traces").iterdir()}
    assert {f"cpu_quickstart_ckpt_{p}.json.gz" for p in ps.PHASES} <= names
    assert (tmp_path / "profile_step.txt").exists()
    assert "update_actor" in out and "families: gemm" in out


def test_device_summary_from_a_trace():
    """Kernels on two streams overlap: busy time is their union, families add every kernel's time."""
    ev = [
        {"cat": "kernel", "name": "nvjet_tst_128x256_64x4_bf16", "ts": 0, "dur": 100},
        {"cat": "kernel", "name": "pytorch_flash::flash_fwd_kernel<...>", "ts": 50, "dur": 100},   # overlaps
        {"cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<...>", "ts": 300, "dur": 20},
        {"cat": "kernel", "name": "multi_tensor_apply_kernel<FusedAdamMathFunctor>", "ts": 400, "dur": 30},
        {"cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32", "ts": 500, "dur": 40},
        {"cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 600, "dur": 10},
        {"cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 600, "dur": 15},
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 900},        # host ops are not device time
    ]
    s = ps.device_summary({"traceEvents": ev}, wall_s=1e-3)
    assert s["families_s"] == {"gemm": 1e-4, "attention": 1e-4, "elementwise/other": 2e-5, "optimizer": 3e-5,
                               "collectives": 4e-5, "memcpy/memset": 1e-5}
    assert s["device_busy_s"] == pytest.approx(250e-6)        # 0-150, 300-320, 400-430, 500-540, 600-610
    assert s["device_idle_fraction"] == pytest.approx(0.75)
    assert s["kernels"] == 5 and s["host_syncs"] == 1 and s["host_sync_s"] == pytest.approx(15e-6)


def test_variant_argument():
    assert ps.parse_variant("base=") == ("base", [])
    assert ps.parse_variant("big=a.b=1,c.d=x=y") == ("big", ["a.b=1", "c.d=x=y"])
    with pytest.raises(Exception, match="expected NAME"):
        ps.parse_variant("a.b=1")

"""Device detection, simulation and software verdicts (CPU host; GPUs are faked through torch.cuda)."""
import dataclasses
from types import SimpleNamespace

import pytest
import torch

from verl.compat.device import detect
from verl.compat.device.catalog import CATALOG, get_profile
from verl.compat.device.detect import (
    UnsupportedDeviceError,
    arch_list_covers,
    check_torch_supports,
    detect_profile,
    detect_software,
)
from verl.compat.device.profile import SoftwareInfo

GiB = 1024**3
cpu_host_only = pytest.mark.skipif(torch.cuda.is_available(), reason="asserts what a GPU-less host reports")
CU126 = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")      # PyTorch 2.8 + cu126
CU128 = ("sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")    # PyTorch 2.8 + cu128
CU130 = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120")


@pytest.fixture(autouse=True)
def no_env_device(monkeypatch):
    monkeypatch.delenv(detect.ENV_DEVICE, raising=False)


def fake_gpu(monkeypatch, name, cc, total_gib, sms=80, optin=None, hip=None, arch="", count=1):
    props = SimpleNamespace(name=name, major=cc[0], minor=cc[1], total_memory=int(total_gib * GiB),
                            multi_processor_count=sms, gcnArchName=arch)
    if optin is not None:
        props.shared_memory_per_block_optin = optin
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: props)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.version, "hip", hip)



def test_a_container_memory_limit_lowers_host_ram(tmp_path):
    """Inside a container /proc/meminfo shows the machine's RAM; the cgroup limit is what the OOM killer enforces."""
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    whole, whole_avail = detect.host_memory_gb(limit_files=())
    v2.write_text("max\n")
    v1.write_text("9223372036854771712\n")   # cgroup v1's "no limit"
    assert detect.cgroup_limit_bytes((str(v2), str(v1))) is None
    assert detect.host_memory_gb(limit_files=(str(v2), str(v1))) == (whole, whole_avail)
    v2.write_text(f"{2**30}\n")                # a 1 GiB container
    total, avail = detect.host_memory_gb(limit_files=(str(v2), str(v1)))
    assert total == 1.0 and avail <= 1.0
    assert detect.cgroup_limit_bytes((str(tmp_path / "absent"), str(v1))) is None

# ----------------------------------------------------------------------------- real device

@cpu_host_only
def test_cpu_host_profile_reports_host_ram():
    profile = detect_profile()
    total, avail = detect.host_memory_gb()
    assert profile.backend == "cpu" and profile.compute_capability is None
    assert not profile.simulated
    assert profile.memory_gb == pytest.approx(total, abs=0.01)
    assert profile.host_memory_gb == profile.memory_gb
    assert 0 < avail <= total
    assert not profile.native_bf16 and not profile.tf32


def test_p40_detected_from_torch_properties(monkeypatch):
    fake_gpu(monkeypatch, "Tesla P40", (6, 1), 23.9, sms=30, count=2)
    p = detect_profile()
    assert (p.backend, p.compute_capability, p.count, p.sm_count) == ("cuda", (6, 1), 2, 30)
    assert p.memory_gb == pytest.approx(23.9)
    assert p.free_memory_gb is None            # no CUDA context yet: free memory is not asked for
    assert p.shared_mem_per_block_kb == 48     # table fallback (no opt-in attribute)
    assert (p.native_bf16, p.tensor_core_fp16, p.tf32) == (False, False, False)
    assert p.bandwidth_gbps == CATALOG["p40"].bandwidth_gbps   # figures borrowed from the catalog


def test_a100_opt_in_shared_memory_and_capabilities(monkeypatch):
    fake_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB", (8, 0), 79.2, sms=108, optin=166912)
    p = detect_profile()
    assert p.shared_mem_per_block_kb == 163
    assert (p.native_bf16, p.tensor_core_fp16, p.tf32) == (True, True, True)
    assert p.bf16_tflops == CATALOG["a100-80gb"].bf16_tflops


def test_v100_has_no_native_bf16_even_if_torch_says_supported(monkeypatch):
    fake_gpu(monkeypatch, "Tesla V100-SXM2-16GB", (7, 0), 15.8)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)   # emulated bf16
    p = detect_profile()
    assert not p.native_bf16 and p.tensor_core_fp16 and not p.tf32
    assert p.bandwidth_gbps == CATALOG["v100-16gb"].bandwidth_gbps


def test_rocm_backend_from_hip_build(monkeypatch):
    fake_gpu(monkeypatch, "AMD Instinct MI300X", (9, 4), 191.5, sms=304, hip="6.2",
             arch="gfx942:sramecc+:xnack-")
    p = detect_profile()
    assert p.backend == "rocm" and p.native_bf16 and p.tensor_core_fp16


@cpu_host_only
def test_unsupported_accelerator_is_planned_as_cpu_with_a_note(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    p = detect_profile()
    assert p.backend == "cpu"
    assert "Apple MPS" in p.note and "CPU" in p.note


@pytest.mark.parametrize("cc,kb", [((5, 2), 48), ((6, 1), 48), ((7, 0), 96), ((7, 5), 64),
                                   ((8, 0), 163), ((8, 6), 99), ((8, 9), 99), ((9, 0), 227),
                                   ((10, 3), 227), ((12, 0), 99)])
def test_shared_memory_fallback_table(cc, kb):
    assert detect._smem_fallback_kb(cc) == kb


# ----------------------------------------------------------------------------- simulation

@pytest.mark.parametrize("name", sorted(CATALOG))
def test_every_catalog_device_can_be_simulated(name):
    p = detect_profile(name)
    ref = CATALOG[name]
    assert p.simulated
    assert (p.backend, p.compute_capability, p.native_bf16, p.tf32) == (
        ref.backend, ref.compute_capability, ref.native_bf16, ref.tf32)
    if ref.backend != "cpu" and not torch.cuda.is_available():
        assert p.memory_gb == ref.memory_gb     # no real GPU here: the catalog figure as is
    software = detect_software(p)
    assert set(software.notes) >= {"torch", "flash_attn", "xformers", "vllm", "triton"}


def test_env_var_names_the_device_and_explicit_name_wins(monkeypatch):
    monkeypatch.setenv(detect.ENV_DEVICE, "t4")
    assert detect_profile().compute_capability == (7, 5)
    assert detect_profile("p40").compute_capability == (6, 1)
    monkeypatch.setenv(detect.ENV_DEVICE, "auto")
    assert not detect_profile().simulated


def test_unknown_device_error_lists_the_names():
    with pytest.raises(ValueError, match="Valid names: .*p40"):
        detect_profile("p4000")


def test_simulated_gpu_on_a_real_gpu_takes_the_smaller_memory_and_real_count(monkeypatch):
    real = dataclasses.replace(get_profile("h200"), memory_gb=139.8, free_memory_gb=130.0, count=8,
                               host_memory_gb=2000.0)
    monkeypatch.setattr(detect, "detect_real_profile", lambda: real)
    p40 = detect_profile("p40")
    assert (p40.memory_gb, p40.free_memory_gb, p40.count, p40.compute_capability) == (23.9, 23.9, 8, (6, 1))
    assert p40.host_memory_gb == 2000.0 and p40.simulated
    # MFU's denominator is the GPU doing the work (the plan's dtype rules stay the P40's)
    assert (p40.fp32_tflops, p40.fp16_tflops, p40.bf16_tflops) == (real.fp32_tflops, real.fp16_tflops, 0.0)
    small = dataclasses.replace(real, memory_gb=79.1, free_memory_gb=70.0)
    monkeypatch.setattr(detect, "detect_real_profile", lambda: small)
    h200 = detect_profile("h200")
    assert (h200.memory_gb, h200.free_memory_gb) == (79.1, 70.0)


# ----------------------------------------------------------------------------- software verdicts

def test_p40_verdicts_name_the_capability():
    sw = detect_software(detect_profile("p40"))
    assert not (sw.flash_attn_usable or sw.vllm_usable or sw.triton_usable or sw.xformers_usable)
    for key in ("flash_attn", "vllm", "triton"):
        assert "sm_61" in sw.notes[key]


def test_cpu_verdicts(monkeypatch):
    sw = detect_software(detect_profile("cpu"))
    assert not sw.xformers_usable and not sw.flash_attn_usable
    assert "CPU" in sw.notes["xformers"]
    monkeypatch.setattr(detect.shutil, "which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    assert detect._compile_verdict(detect_profile("cpu")) == (
        False, "torch.compile on CPU needs a C++ compiler; none found on PATH")


@pytest.mark.parametrize("device,version,usable,words", [
    ("p40", "0.8.5", False, "7.0+"),
    ("t4", "0.8.5", True, "float16 only"),
    ("a100-80gb", "0.8.5", True, "supports sm_80"),
    ("a100-80gb", "0.8.5+cpu", False, "CPU build"),
    ("cpu", "0.8.5+cpu", True, "CPU build"),
    ("cpu", "0.8.5", False, "GPU build"),
])
def test_vllm_verdict(device, version, usable, words):
    ok, note = detect._vllm_verdict(get_profile(device), version)
    assert ok is usable and words in note


@pytest.mark.parametrize("device,usable,words", [
    ("t4", False, "needs sm_80+"), ("v100-32gb", False, "needs sm_80+"), ("cpu", False, "no CPU"),
    pytest.param("a100-80gb", False, "no GPU on this host", marks=cpu_host_only),
])
def test_flash_attn_verdict(device, usable, words):
    ok, note = detect._flash_attn_verdict(get_profile(device), "2.7.4")
    assert ok is usable and words in note


@pytest.mark.parametrize("device,usable,words", [
    ("cpu", False, "CUDA only"), ("t4", False, "needs sm_80+ (this is sm_75)"), ("v100-32gb", False, "needs sm_80+"),
    ("a100-80gb", True, "ships"), ("h200", True, "ships"),
])
def test_torch_varlen_verdict_needs_sm80_and_the_kernel_in_torch(device, usable, words, monkeypatch):
    monkeypatch.setattr(detect, "varlen_kernel_available", lambda: (True, "torch 2.11 ships it"))
    ok, note = detect._torch_varlen_verdict(get_profile(device))
    assert ok is usable and words in note
    monkeypatch.setattr(detect, "varlen_kernel_available", lambda: (False, "torch 2.9 has none"))
    assert detect._torch_varlen_verdict(get_profile(device))[0] is False


@cpu_host_only
def test_torch_varlen_kernel_check_reads_this_torch_build():
    from verl.compat.device.support import varlen_kernel_available

    ok, note = varlen_kernel_available()   # a CPU build of torch has no FlashAttention kernels
    assert not ok and ("built without" in note or "no torch.nn.attention.varlen" in note)


@cpu_host_only
def test_xformers_needs_a_gpu_to_probe():
    ok, note = detect._xformers_verdict(get_profile("t4"), "0.0.29")
    assert not ok and "no GPU" in note


# ----------------------------------------------------------------------------- torch build check

@pytest.mark.parametrize("arch,cc,covered", [
    (CU126, (6, 1), True),      # sm_60 cubin runs on sm_61
    (CU128, (6, 1), False),
    (CU128, (7, 0), True),
    (CU130, (7, 0), False),
    (CU130, (8, 9), True),      # sm_86 cubin runs on sm_89
    (("sm_80", "compute_80"), (12, 0), True),   # PTX is JIT-compiled for newer GPUs
    (("sm_80",), (9, 0), False),
])
def test_arch_list_coverage(arch, cc, covered):
    assert arch_list_covers(arch, cc) is covered


def _software(arch):
    return SoftwareInfo(torch_version="2.8.0+cu128", torch_arch_list=arch)


def test_pascal_on_a_cu128_build_fails_naming_cu126():
    p40 = dataclasses.replace(get_profile("p40"), name="Tesla P40")
    with pytest.raises(UnsupportedDeviceError) as err:
        check_torch_supports(p40, _software(CU128))
    msg = str(err.value)
    assert "sm_61" in msg and "Tesla P40" in msg and "sm_70, sm_75" in msg
    assert "https://download.pytorch.org/whl/cu126" in msg and "PyTorch 2.8" in msg
    check_torch_supports(p40, _software(CU126))    # a cu126 build is fine


def test_volta_on_a_cuda13_build_fails_naming_cu126():
    with pytest.raises(UnsupportedDeviceError, match="Volta sm_70.*cu126"):
        check_torch_supports(get_profile("v100-32gb"), _software(CU130))


def test_kepler_needs_a_source_build():
    k80 = dataclasses.replace(get_profile("p40"), name="Tesla K80", compute_capability=(3, 7))
    with pytest.raises(UnsupportedDeviceError, match="from source"):
        check_torch_supports(k80, _software(CU126))


def test_simulated_and_cpu_profiles_are_not_checked():
    sim = dataclasses.replace(get_profile("p40"), simulated=True)
    check_torch_supports(sim, _software(CU130))
    check_torch_supports(get_profile("cpu"), _software(()))


# ----------------------------------------------------------------------------- on a real GPU

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_gpu
def test_real_gpu_profile_matches_torch():
    props = torch.cuda.get_device_properties(0)
    p = detect_profile()
    assert p.backend == ("rocm" if torch.version.hip else "cuda") and not p.simulated
    assert p.compute_capability == (props.major, props.minor)
    assert p.memory_gb == pytest.approx(props.total_memory / GiB, abs=0.01)
    assert p.sm_count == props.multi_processor_count
    if getattr(props, "shared_memory_per_block_optin", 0):
        assert p.shared_mem_per_block_kb == props.shared_memory_per_block_optin // 1024
    assert p.native_bf16 == (props.major >= 8) and p.tf32 == (props.major >= 8)
    software = detect_software(p)
    check_torch_supports(p, software)            # the build in use runs here, by definition
    assert software.torch_arch_list == tuple(torch.cuda.get_arch_list())


@pytest.mark.gpu
@needs_gpu
def test_simulated_p40_verdicts_on_a_real_gpu_follow_sm_61():
    real = detect_profile()
    p40 = detect_profile("p40")
    assert p40.simulated and p40.memory_gb == min(23.9, real.memory_gb) and p40.count == real.count
    software = detect_software(p40)
    assert not (software.flash_attn_usable or software.vllm_usable or software.triton_usable)


def test_xformers_probe_reports_why_it_cannot_run():
    """The probe runs in a child process and reports the failure as one line (here: no GPU, or
    no xformers at all on this test host)."""
    detect._xformers_probe.cache_clear()
    reason = detect._xformers_probe("float16")
    if torch.cuda.is_available() and reason is None:
        pytest.skip("xformers kernels run on this GPU")
    assert isinstance(reason, str) and reason and "\n" not in reason


def test_xformers_probe_verdict_is_kept_on_disk_per_versions_and_gpu(tmp_path, monkeypatch):
    """The child process costs 10-15 s of start-up on a GPU host: a second run reads the verdict."""
    monkeypatch.setenv("VERL_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(detect, "_run_xformers_probe", lambda dtype: calls.append(dtype) or f"no kernels for {dtype}")
    for _ in range(2):
        detect._xformers_probe.cache_clear()
        assert detect._xformers_probe("float16") == "no kernels for float16"
    detect._xformers_probe.cache_clear()
    assert detect._xformers_probe("bfloat16") == "no kernels for bfloat16"   # another dtype: probed again
    assert calls == ["float16", "bfloat16"]
    detect._xformers_probe.cache_clear()


# ----------------------------------------------------------------------------- a simulated GPU with no GPU

SIM_RUN = ["data.train_batch_size=256", "actor_rollout_ref.actor.ppo_mini_batch_size=64",
           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=auto",
           "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=auto",
           "critic.ppo_micro_batch_size_per_gpu=auto", "trainer.n_gpus_per_node=1"]


def test_training_a_simulated_gpu_on_a_gpu_less_host_fails_in_the_plan_before_ray(monkeypatch, tmp_path):
    """compat.device=p40 without a real GPU: a clear error from build_plan, before any worker or model,
    and before Ray starts (the plan is made before the inputs are checked, and both before ray.init)."""
    import ray

    from verl.compat import SimulationNeedsGPUError
    from verl.trainer import preflight
    from verl.trainer.config_check import load_config
    from verl.trainer.ppo import task_runner

    events = []
    monkeypatch.setattr(preflight, "input_problems", lambda config: [])   # the files are fine; the device is not
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(ray, "is_initialized", lambda: "ray up" in events and "ray down" not in events)
    monkeypatch.setattr(task_runner, "_init_ray", lambda config: events.append("ray up"))
    monkeypatch.setattr(ray, "shutdown", lambda: events.append("ray down"))
    monkeypatch.setattr(task_runner, "worker_layout", lambda *a: pytest.fail("workers started"))
    config = load_config(SIM_RUN + ["compat.device=p40", f"trainer.default_local_dir={tmp_path / 'ckpt'}"])
    with pytest.raises(SimulationNeedsGPUError) as err:
        task_runner.run_ppo(config)
    assert events == []
    message = str(err.value)
    assert "compat.device=p40" in message and "this host has no GPU" in message
    assert "python -m verl.compat --device p40" in message and "drop compat.device" in message


def test_env_var_simulation_is_checked_too_and_the_doctor_still_plans(monkeypatch, capsys):
    from verl import compat
    from verl.compat.__main__ import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(detect.ENV_DEVICE, "t4")
    with pytest.raises(compat.SimulationNeedsGPUError, match="VERL_COMPAT_DEVICE"):
        compat.build_plan({"compat": {"device": None}})
    for device in ("p40", "t4", "a100-80gb", "h200", "cpu"):
        assert main(["--device", device, "--model-spec", "qwen2.5-0.5b", *SIM_RUN]) == 0, device
        assert f"{device} (simulated)" in capsys.readouterr().out


def test_simulation_runs_where_a_gpu_or_only_the_cpu_is_asked(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    detect.check_can_run(detect_profile())                      # the real CPU
    detect.check_can_run(detect_profile("cpu"))                 # a simulated CPU is the CPU
    fake_gpu(monkeypatch, "Tesla P100-PCIE-16GB", (6, 0), 16)
    detect.check_can_run(detect_profile("p40"))                 # a real GPU to simulate on


def test_xformers_is_probed_only_when_a_model_asks_for_it(monkeypatch):
    """The probe's child process costs 10-15 s on a machine without a cached verdict (it was most of the
    H200's 17 s planning stage on a fresh machine); the planner uses xformers only where a model asks
    for attn_implementation=xformers, so build_plan probes only then."""
    import verl.compat as compat
    from verl.compat.device.catalog import get_profile
    from verl.compat.planning.model_spec import ModelSpec
    from verl.compat.planning.planner import xformers_asked
    from verl.trainer.config_check import load_config
    from transformers import Qwen2Config

    with monkeypatch.context() as gpu_host:
        gpu_host.setattr(torch.cuda, "is_available", lambda: True)
        gpu_host.setattr(detect, "_xformers_probe", lambda dtype: pytest.fail("probed"))
        ok, why = detect._xformers_verdict(get_profile("t4"), "0.0.35", probe=False)
    assert ok is False and "not probed" in why and "attn_implementation=xformers" in why

    plain = load_config(SIM_RUN)
    asked = load_config(SIM_RUN + ["actor_rollout_ref.model.attn_implementation=xformers"])
    critic = load_config(SIM_RUN + ["+critic.model.override_config.attn_implementation=xformers"])
    assert (xformers_asked(plain), xformers_asked(asked), xformers_asked(critic)) == (False, True, True)

    seen = []
    real = compat.detect_software
    monkeypatch.setattr(compat, "detect_software",
                        lambda profile, probe_xformers=True: seen.append(probe_xformers) or real(profile, False))
    model = ModelSpec.from_hf_config(Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128,
                                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    for config in (plain, asked):
        compat.build_plan(config, model=model, to_run=False)
    assert seen == [False, True]


def test_versions_are_read_without_scanning_every_distribution_when_names_match():
    """The module -> distribution map reads every installed distribution's file list (seconds in a big GPU
    image); a module whose distribution carries its name must not build it; one that does not still resolves."""
    import importlib.metadata

    detect._module_distributions.cache_clear()
    assert detect._version("transformers") == importlib.metadata.version("transformers")
    assert detect._module_distributions.cache_info().misses == 0
    assert detect._version("yaml") == importlib.metadata.version("PyYAML")    # imported as yaml
    assert detect._version("surely_not_installed_module") is None

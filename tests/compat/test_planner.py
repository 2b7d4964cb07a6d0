"""make_plan: the rules per device, overrides, the offload ladder, PlanError, and purity."""
import dataclasses
import itertools
import os

import pytest
import transformers

from verl.compat.device.catalog import CATALOG, get_profile
from verl.compat.planning.memory import Workload, estimate_memory
from verl.compat.planning.model_spec import ModelSpec
from verl.compat.planning.planner import PlanError, make_plan
from verl.compat.device.profile import SoftwareInfo

QWEN05 = ModelSpec.from_hf_config(transformers.Qwen2Config(
    vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    intermediate_size=4864, tie_word_embeddings=True, max_position_embeddings=32768))
PLAIN = SoftwareInfo(torch_version="2.11.0", triton_usable=True)
# FULL has every package installed and usable, vLLM included (the engines are this verl's own,
# verl.compat.device.engines, which lists vllm): the planner's vLLM rules are planned for real.
FULL = SoftwareInfo(torch_version="2.11.0", triton_usable=True, flash_attn_version="2.8", flash_attn_usable=True,
                    xformers_version="0.0.30", xformers_usable=True, vllm_version="0.11", vllm_usable=True)
NONE = SoftwareInfo(torch_version="2.11.0")


def config(batch, prompt, response, mini, micro, log_prob_micro, **extra):
    cfg = {
        "data": {"train_batch_size": batch, "max_prompt_length": prompt, "max_response_length": response},
        "actor_rollout_ref": {
            "model": {"attn_implementation": "auto", "use_remove_padding": "auto"},
            "actor": {"ppo_mini_batch_size": mini, "ppo_micro_batch_size_per_gpu": micro,
                      "use_torch_compile": "auto", "fsdp_config": {"dtype": "auto", "param_offload": "auto",
                                                                   "optimizer_offload": "auto"}},
            "rollout": {"name": "auto", "dtype": "auto", "gpu_memory_utilization": "auto",
                        "log_prob_micro_batch_size_per_gpu": log_prob_micro},
            "ref": {"log_prob_micro_batch_size_per_gpu": log_prob_micro},
        },
        "critic": {"ppo_micro_batch_size_per_gpu": micro},
        "algorithm": {"adv_estimator": "gae", "use_kl_in_reward": False},
        "trainer": {"n_gpus_per_node": 1, "nnodes": 1},
        "compat": {"strict": False, "memory_margin": 0.1},
    }
    for path, value in extra.items():
        node = cfg
        *parents, leaf = path.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return cfg


QUICKSTART = config(256, 512, 512, 64, 4, 8)
FIELD = config(1, 256, 256, 1, 1, 1)
# devices too small for a 0.5B actor + critic (none: under param offload weights, gradients and the AdamW
# step stay in host memory, so the 11 GiB RTX 2080 Ti holds the gathered units and activations)
TOO_SMALL = {"quickstart": set(), "field": set()}
EXPECTED_DTYPE = {"cpu": "float32", "p40": "float32", "p100": "float32", "v100-16gb": "float16",
                  "v100-32gb": "float16", "t4": "float16", "rtx2080ti": "float16"}


def roles(plan):
    return [r for r in (plan.actor, plan.critic, plan.ref) if r is not None]


@pytest.mark.parametrize("setting,cfg", [("quickstart", QUICKSTART), ("field", FIELD)])
@pytest.mark.parametrize("device", sorted(CATALOG))
def test_every_device_gets_a_plan(device, setting, cfg):
    profile = CATALOG[device]
    if device in TOO_SMALL[setting]:
        with pytest.raises(PlanError, match=r"GiB more than the device has"):
            make_plan(profile, cfg, PLAIN, QWEN05)
        return
    plan = make_plan(profile, cfg, PLAIN, QWEN05)
    dtype = EXPECTED_DTYPE.get(device, "bfloat16")
    for r in roles(plan):
        assert r.compute_dtype == dtype
        assert r.param_dtype == "float32"                 # trained roles keep float32 master weights
        assert r.grad_scaler == (dtype == "float16")
        assert r.attn_implementation == "sdpa"            # no flash_attn installed
        assert r.use_remove_padding is False
    assert plan.critic is not None and plan.ref is None   # gae needs a critic; no KL -> no reference
    assert plan.rollout.name == "hf" and plan.rollout.dtype == dtype
    assert plan.dist_backend == ("gloo" if device == "cpu" else "cpu:gloo,cuda:nccl")
    assert plan.device_type == ("cpu" if device == "cpu" else "cuda")
    assert plan.torch_compile == (device not in ("cpu", "p40", "p100"))
    assert plan.tf32 == profile.tf32
    assert 0 < plan.predicted_peak_gb and plan.memory["required_gb"] <= profile.memory_gb
    assert plan.memory_limit_gb == profile.memory_gb
    for key in ("actor.compute_dtype", "actor.attn_implementation", "rollout.name", "dist_backend",
                "torch_compile", "actor.param_offload", "memory"):
        assert plan.reasons[key]
    assert plan.warnings == []
    assert 1 <= plan.rollout.micro_batch_size <= 1024 and plan.reasons["rollout.micro_batch_size"]
    plan.to_dict()


@pytest.mark.parametrize("device", ["cpu", "t4", "a100-80gb", "mi300x"])
def test_dist_backend_routes_host_tensors_to_gloo(device):
    """On an accelerator the loss token counts and checkpoint barriers all-reduce CPU tensors, which plain
    nccl rejects with 2+ ranks: torch's own parser must read the plan's string as gloo for CPU tensors."""
    from torch.distributed import Backend
    from torch.distributed.distributed_c10d import BackendConfig

    plan = make_plan(get_profile(device), QUICKSTART, PLAIN, QWEN05)
    backends = BackendConfig(Backend(plan.dist_backend)).get_device_backend_map()
    assert backends["cpu"] == "gloo"
    if device == "cpu":
        assert plan.dist_backend == "gloo" and "across nodes" in plan.reasons["dist_backend"]
    else:
        assert backends["cuda"] == "nccl" and "CPU tensors" in plan.reasons["dist_backend"]


def test_field_report_on_p40_needs_no_hand_patches():
    plan = make_plan(get_profile("p40"), FIELD, PLAIN, QWEN05)
    assert plan.actor.compute_dtype == "float32"                  # patch 2: bf16 -> fp32
    assert plan.actor.attn_implementation == "sdpa"               # patch 3: no flash_attention_2
    assert plan.rollout.name == "hf" and not plan.torch_compile   # no vLLM / Triton on sm_61
    assert "sm_61" in plan.reasons["actor.compute_dtype"]


def test_quickstart_on_a100_with_full_software():
    plan = make_plan(get_profile("a100-80gb"), QUICKSTART, FULL, QWEN05)
    assert plan.actor.compute_dtype == "bfloat16" and plan.actor.param_dtype == "float32"
    assert plan.actor.attn_implementation == "flash_attention_2" and plan.use_remove_padding
    assert plan.rollout.name == "vllm" and plan.rollout.dtype == "bfloat16"
    assert 0.1 <= plan.rollout.gpu_memory_utilization <= 0.9
    assert not plan.actor.param_offload and not plan.actor.optimizer_offload


def test_vllm_share_is_what_training_leaves():
    small = make_plan(get_profile("l4"), QUICKSTART, FULL, QWEN05)
    big = make_plan(get_profile("h200"), QUICKSTART, FULL, QWEN05)
    assert small.rollout.gpu_memory_utilization < big.rollout.gpu_memory_utilization
    assert small.memory["required_gb"] <= get_profile("l4").memory_gb


@pytest.mark.parametrize("device", ["t4", "v100-32gb"])
def test_volta_turing_get_vllm_in_fp16_but_not_flash(device):
    plan = make_plan(get_profile(device), QUICKSTART, FULL, QWEN05)
    assert plan.rollout.name == "vllm" and plan.rollout.dtype == "float16"
    assert plan.actor.attn_implementation in ("sdpa", "xformers")


VARLEN = dataclasses.replace(PLAIN, torch_varlen_usable=True)


@pytest.mark.parametrize("device", ["h200", "a100-80gb", "rtx3090"])
def test_sm80_without_flash_attn_packs_with_torchs_varlen_kernel(device):
    plan = make_plan(get_profile(device), QUICKSTART, VARLEN, QWEN05)
    for role in (plan.actor, plan.critic):
        assert role.attn_implementation == "torch_varlen" and role.use_remove_padding is True
    assert "variable-length FlashAttention" in plan.reasons["actor.attn_implementation"]
    assert "real tokens only" in plan.reasons["actor.use_remove_padding"]
    # flash_attn, where it is installed and usable, is still the first choice
    full = make_plan(get_profile(device), QUICKSTART, dataclasses.replace(FULL, torch_varlen_usable=True), QWEN05)
    assert full.actor.attn_implementation == "flash_attention_2" and full.actor.use_remove_padding is True


def test_torch_varlen_is_not_planned_for_float32_or_older_gpus_and_user_choices_stand():
    fp32 = config(256, 512, 512, 64, 4, 8)
    fp32["actor_rollout_ref"]["actor"]["fsdp_config"]["dtype"] = "float32"
    plan = make_plan(get_profile("h200"), fp32, VARLEN, QWEN05)
    assert plan.actor.attn_implementation == "sdpa" and plan.actor.use_remove_padding is False
    assert make_plan(get_profile("p40"), config(8, 256, 256, 8, 1, 1), NONE, QWEN05).actor.attn_implementation == "sdpa"
    padded = config(256, 512, 512, 64, 4, 8)
    padded["actor_rollout_ref"]["model"]["use_remove_padding"] = False
    plan = make_plan(get_profile("h200"), padded, VARLEN, QWEN05)
    assert plan.actor.attn_implementation == "torch_varlen" and plan.actor.use_remove_padding is False
    asked = config(256, 512, 512, 64, 4, 8)
    asked["actor_rollout_ref"]["model"]["attn_implementation"] = "torch_varlen"
    plan = make_plan(get_profile("h200"), asked, PLAIN, QWEN05)   # this torch lacks the kernel: adapted, said why
    assert plan.actor.attn_implementation == "sdpa" and any("torch_varlen" in w for w in plan.warnings)


def test_a_setting_adapted_for_several_roles_is_named_once():
    """actor_rollout_ref.model.use_remove_padding=True serves the actor and the reference: on the CPU both are
    adapted, and the warning (logged at start-up) names the setting once."""
    packed = config(8, 256, 256, 8, 1, 1, actor_rollout_ref__actor__use_kl_loss=True)
    packed["actor_rollout_ref"]["model"]["use_remove_padding"] = True
    plan = make_plan(get_profile("cpu"), packed, PLAIN, QWEN05)
    assert plan.actor.use_remove_padding is False and plan.ref.use_remove_padding is False
    named = [w for w in plan.warnings if w.startswith("actor_rollout_ref.model.use_remove_padding=True")]
    assert len(named) == 1, plan.warnings


def test_upstream_kernel_library_switches_are_said_not_refused():
    """Upstream's qwen3-1.7b example asks for `use_liger` and `use_fused_kernels`: the plan warns once that Liger is not
    used (and why), notes what replaces the fused kernels, and plans as without them; compat.strict refuses."""
    asked = config(8, 256, 256, 8, 1, 1, actor_rollout_ref__actor__use_kl_loss=True,
                   actor_rollout_ref__model__use_liger=True, actor_rollout_ref__model__use_fused_kernels=True)
    plan = make_plan(get_profile("h200"), asked, PLAIN, QWEN05)
    liger = [w for w in plan.warnings if w.startswith("actor_rollout_ref.model.use_liger=True")]
    assert len(liger) == 1 and "inductor fuses" in liger[0]
    assert "float32 chunks" in plan.reasons["actor.use_fused_kernels"]
    plain = make_plan(get_profile("h200"), config(8, 256, 256, 8, 1, 1, actor_rollout_ref__actor__use_kl_loss=True),
                      PLAIN, QWEN05)
    assert plan.actor == plain.actor and plan.rollout == plain.rollout
    with pytest.raises(PlanError, match="use_liger"):
        make_plan(get_profile("h200"), {**asked, "compat": {"strict": True, "memory_margin": 0.1}}, PLAIN, QWEN05)


def test_rocm_plan():
    plan = make_plan(get_profile("mi300x"), QUICKSTART, PLAIN, QWEN05)
    assert plan.actor.compute_dtype == "bfloat16" and plan.dist_backend == "cpu:gloo,cuda:nccl" and plan.device_type == "cuda"


# ----------------------------------------------------------------------------- properties

USER_CHOICES = {
    "actor_rollout_ref__actor__fsdp_config__dtype": ["auto", "bfloat16", "float16", "float32"],
    "actor_rollout_ref__model__attn_implementation": ["auto", "flash_attention_2", "xformers", "eager"],
    "actor_rollout_ref__rollout__name": ["auto", "vllm", "hf"],
    "actor_rollout_ref__actor__use_torch_compile": ["auto", True],
    "actor_rollout_ref__model__use_remove_padding": ["auto", True],
}


def _lacks(plan, profile, software):
    """What the plan picked that the device or software cannot do (empty when sound)."""
    bad = []
    cc = profile.compute_capability or (0, 0)
    for r in roles(plan) + [plan.rollout]:
        dt = getattr(r, "compute_dtype", None) or r.dtype
        if dt == "bfloat16" and not profile.native_bf16:
            bad.append("bf16")
        if dt == "float16" and not profile.tensor_core_fp16:
            bad.append("fp16 without tensor cores")
        if r.attn_implementation == "flash_attention_2" and (not software.flash_attn_usable or cc < (8, 0)):
            bad.append("flash_attention_2")
        if r.attn_implementation == "xformers" and not software.xformers_usable:
            bad.append("xformers")
    for r in roles(plan):
        if r.use_remove_padding and r.attn_implementation != "flash_attention_2":
            bad.append("remove padding")
        if r.grad_scaler != (r.compute_dtype == "float16" and r is not plan.ref):
            bad.append("grad scaler")
    # vllm_usable is detect's verdict for this device: on a CPU it means vLLM's CPU build is installed
    if plan.rollout.name == "vllm" and (not software.vllm_usable or (profile.backend == "cuda" and cc < (7, 0))):
        bad.append("vllm")
    if plan.torch_compile and (profile.backend == "cpu" or cc < (7, 0) or not software.triton_usable):
        bad.append("torch.compile")
    if plan.tf32 and not profile.tf32:
        bad.append("tf32")
    return bad


def test_no_plan_picks_what_its_device_lacks():
    """Exhaustive: every device x software x combination of user overrides (non-strict)."""
    keys = list(USER_CHOICES)
    checked = 0
    for device, software in itertools.product(sorted(CATALOG), (NONE, PLAIN, FULL)):
        profile = CATALOG[device]
        for values in itertools.product(*USER_CHOICES.values()):
            cfg = config(8, 128, 128, 8, 2, 2, **dict(zip(keys, values)))
            plan = make_plan(profile, cfg, software, ModelSpec.from_hf_config(TINY))
            assert _lacks(plan, profile, software) == [], (device, values)
            checked += 1
    assert checked == len(CATALOG) * 3 * 4 * 4 * 3 * 2 * 2


TINY = transformers.Qwen2Config(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, intermediate_size=128)


@pytest.mark.parametrize("key,value,device,needle", [
    ("actor_rollout_ref__actor__fsdp_config__dtype", "bfloat16", "p40", "bfloat16 needs compute capability >= 8.0"),
    ("actor_rollout_ref__actor__fsdp_config__dtype", "float16", "p40", "float16 needs tensor cores"),
    ("actor_rollout_ref__actor__fsdp_config__dtype", "bfloat16", "t4", "sm_75"),
    ("actor_rollout_ref__model__attn_implementation", "flash_attention_2", "a100-40gb", "flash_attn"),
    ("actor_rollout_ref__rollout__name", "vllm", "p40", "vllm"),
    ("actor_rollout_ref__actor__use_torch_compile", True, "p40", "Triton"),
])
def test_impossible_override_is_adapted_with_warning_or_refused_in_strict(key, value, device, needle):
    software = PLAIN
    cfg = config(8, 128, 128, 8, 2, 2, **{key: value})
    plan = make_plan(get_profile(device), cfg, software, ModelSpec.from_hf_config(TINY))
    assert any(needle in w and str(value) in w and "using" in w for w in plan.warnings), plan.warnings
    assert _lacks(plan, get_profile(device), software) == []
    strict = config(8, 128, 128, 8, 2, 2, compat__strict=True, **{key: value})
    with pytest.raises(PlanError, match="compat.strict=true"):
        make_plan(get_profile(device), strict, software, ModelSpec.from_hf_config(TINY))


def test_detected_software_lists_the_engines_the_workers_build():
    """compat owns the engine list (it imports no worker); the workers' registry matches it."""
    from verl.compat import detect_software
    from verl.compat.device.engines import ENGINES as LISTED
    from verl.compat.device.engines import check_registry
    from verl.workers.rollout import ENGINES

    assert detect_software(get_profile("cpu")).rollout_engines == tuple(LISTED) == tuple(ENGINES) == ("hf", "vllm")
    with pytest.raises(ImportError, match="add or remove the engine in both places"):
        check_registry({**ENGINES, "other": object})


def test_an_unknown_engine_is_adapted_naming_the_engines_this_verl_ships():
    cfg = config(8, 128, 128, 8, 2, 2, actor_rollout_ref__rollout__name="sglang")
    plan = make_plan(get_profile("h100"), cfg, PLAIN, ModelSpec.from_hf_config(TINY))
    assert plan.rollout.name == "hf"
    assert any("sglang" in w and "this verl ships the vllm and built-in (hf) engines only" in w for w in plan.warnings)


def test_possible_override_wins():
    cfg = config(8, 128, 128, 8, 2, 2, actor_rollout_ref__actor__fsdp_config__dtype="float32",
                 actor_rollout_ref__model__attn_implementation="eager", actor_rollout_ref__rollout__name="hf",
                 actor_rollout_ref__actor__use_torch_compile=False)
    plan = make_plan(get_profile("h100"), cfg, FULL, ModelSpec.from_hf_config(TINY))
    assert plan.actor.compute_dtype == "float32" and plan.actor.attn_implementation == "eager"
    assert plan.rollout.name == "hf" and plan.torch_compile is False and plan.warnings == []
    assert plan.reasons["actor.compute_dtype"].startswith("set by the user")


def test_explicit_offload_and_checkpointing_are_honoured():
    cfg = config(8, 128, 128, 8, 2, 2, actor_rollout_ref__actor__fsdp_config__param_offload=True,
                 actor_rollout_ref__model__enable_gradient_checkpointing=False)
    plan = make_plan(get_profile("h200"), cfg, PLAIN, ModelSpec.from_hf_config(TINY))
    assert plan.actor.param_offload is True and plan.actor.gradient_checkpointing is False
    assert plan.critic.param_offload is False


# ----------------------------------------------------------------------------- the memory ladder

def _rung(plan):
    a = plan.actor
    return (a.param_offload, a.optimizer_offload, -a.micro_batch_size_per_gpu)


def test_offload_ladder_order_as_memory_shrinks():
    """Shrinking the device walks: nothing -> optimizer offload -> params + optimizer -> smaller micro-batches.
    (Long responses, so that a micro-batch's logits, not the optimizer step, bound the offloaded plan:
    halving is only taken where it lowers the peak.)"""
    base = get_profile("a100-80gb")
    cfg = config(64, 512, 2048, 64, 8, 8, actor_rollout_ref__model__enable_gradient_checkpointing=True)
    seen = []
    for quarter in range(80 * 4, 4, -1):
        gb = quarter / 4
        try:
            plan = make_plan(dataclasses.replace(base, memory_gb=gb), cfg, PLAIN, QWEN05)
        except PlanError as exc:
            seen.append("error")
            assert "GiB more than the device has" in str(exc)
            break
        assert plan.memory["required_gb"] <= gb
        state = ("params+optimizer" if plan.actor.param_offload else
                 "optimizer" if plan.actor.optimizer_offload else "nothing")
        if plan.actor.micro_batch_size_per_gpu < 8:
            state = f"micro {plan.actor.micro_batch_size_per_gpu}"
            assert "halved" in plan.reasons["actor.micro_batch_size_per_gpu"]
        if not seen or seen[-1] != state:
            seen.append(state)
    assert seen[:3] == ["nothing", "optimizer", "params+optimizer"], seen
    micro = [int(s.split()[1]) for s in seen if s.startswith("micro")]
    assert micro and micro == sorted(micro, reverse=True) and micro[0] == 4, seen
    assert seen[-1] == "error"
    # the micro-batch never touches the mini-batch: the update's math is unchanged
    assert cfg["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"] == 64


def test_plan_error_states_shortfall_and_what_would_fit():
    tiny_gpu = dataclasses.replace(get_profile("t4"), memory_gb=2.0)
    with pytest.raises(PlanError) as err:
        make_plan(tiny_gpu, QUICKSTART, PLAIN, QWEN05)
    msg = str(err.value)
    assert "t4 (2.0 GiB)" in msg and "GiB more than the device has" in msg
    assert "largest setting that fits" in msg.lower() or "at least" in msg


def test_gradient_checkpointing_auto_turns_on_only_when_needed():
    cfg = config(64, 512, 512, 64, 8, 8)
    roomy = make_plan(get_profile("h200"), cfg, PLAIN, QWEN05)
    tight = make_plan(get_profile("l4"), cfg, PLAIN, QWEN05)
    assert roomy.actor.gradient_checkpointing is False
    assert tight.actor.gradient_checkpointing is True
    assert "do not fit" in tight.reasons["actor.gradient_checkpointing"]


def test_without_model_spec_memory_is_not_planned():
    plan = make_plan(get_profile("a100-80gb"), QUICKSTART, PLAIN, None)
    assert plan.predicted_peak_gb == 0.0 and "no model config.json" in plan.reasons["memory"]
    assert plan.actor.micro_batch_size_per_gpu == 4


# ----------------------------------------------------------------------------- purity

def test_plan_is_pure(monkeypatch):
    import torch

    def boom(*a, **k):
        raise AssertionError("make_plan touched the device or the environment")

    monkeypatch.setattr(torch.cuda, "is_available", boom)
    monkeypatch.setattr(torch.cuda, "get_device_properties", boom)
    monkeypatch.setattr(os, "getenv", boom)
    monkeypatch.setattr(os.environ, "get", boom)
    first = make_plan(get_profile("t4"), QUICKSTART, PLAIN, QWEN05)
    second = make_plan(get_profile("t4"), QUICKSTART, PLAIN, QWEN05)
    assert first.to_dict() == second.to_dict()


def test_omegaconf_config_with_auto_strings():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(QUICKSTART)
    plan = make_plan(get_profile("v100-32gb"), cfg, PLAIN, QWEN05)
    assert plan.to_dict() == make_plan(get_profile("v100-32gb"), QUICKSTART, PLAIN, QWEN05).to_dict()
    assert plan.actor.compute_dtype == "float16"


# ----------------------------------------------------------------------------- built-in rollout chunks

def _rollout_required(plan, batch, prompt=256, response=256, margin=0.1):
    """Predicted GiB the rollout phase needs (context and margin included) for `batch` prompts in one call."""
    est = estimate_memory(QWEN05, Workload(prompt, response, batch), plan.actor, plan.rollout, plan.critic,
                          plan.ref, device_memory_gb=plan.memory_limit_gb, backend=plan.device.backend,
                          fragmentation=margin)
    return est.phases["rollout"].total_gb * (1 + margin) + est.context_gb


def test_field_report_validation_set_is_generated_in_chunks_that_fit_the_p40():
    """The field report died when validation handed all 1,319 GSM8K test prompts to one generate pass."""
    plan = make_plan(get_profile("p40"), FIELD, PLAIN, QWEN05)
    chunk = plan.rollout.micro_batch_size
    assert chunk == 256 and "free while generating" in plan.reasons["rollout.micro_batch_size"]
    assert _rollout_required(plan, 1319) <= 23.9                     # a chunk of the validation set fits
    assert _rollout_required(plan, chunk + 1) == _rollout_required(plan, 1319)
    unchunked = dataclasses.replace(plan, rollout=dataclasses.replace(plan.rollout, micro_batch_size=None))
    assert _rollout_required(unchunked, 1319) > 1.5 * 23.9            # what OOM'd: the whole set at once
    doubled = dataclasses.replace(plan, rollout=dataclasses.replace(plan.rollout, micro_batch_size=2 * chunk))
    assert _rollout_required(doubled, 1319) > 23.9                    # the largest power of two that fits
    assert not plan.actor.param_offload and not plan.actor.optimizer_offload   # training plan unchanged


def test_rollout_chunk_uses_host_memory_on_cpu():
    cpu = get_profile("cpu")
    small = make_plan(dataclasses.replace(cpu, memory_gb=24.0), FIELD, PLAIN, QWEN05)
    big = make_plan(dataclasses.replace(cpu, memory_gb=48.0), FIELD, PLAIN, QWEN05)
    assert small.rollout.micro_batch_size < big.rollout.micro_batch_size
    assert _rollout_required(small, 1319) <= 24.0 and small.memory["context_gb"] == 0


def test_user_rollout_micro_batch_wins_when_it_fits_else_adapts():
    key = "actor_rollout_ref__rollout__micro_batch_size"
    fits = make_plan(get_profile("p40"), config(1, 256, 256, 1, 1, 1, **{key: 32}), PLAIN, QWEN05)
    assert fits.rollout.micro_batch_size == 32 and fits.warnings == []
    assert fits.reasons["rollout.micro_batch_size"].startswith("set by the user")
    too_big = make_plan(get_profile("p40"), config(1, 256, 256, 1, 1, 1, **{key: 1000}), PLAIN, QWEN05)
    assert too_big.rollout.micro_batch_size == 256
    assert any("micro_batch_size=1000" in w and "using 256" in w for w in too_big.warnings), too_big.warnings
    with pytest.raises(PlanError, match="compat.strict=true"):
        make_plan(get_profile("p40"), config(1, 256, 256, 1, 1, 1, compat__strict=True, **{key: 1000}),
                  PLAIN, QWEN05)
    with pytest.raises(PlanError, match="positive whole number"):
        make_plan(get_profile("p40"), config(1, 256, 256, 1, 1, 1, **{key: 0}), PLAIN, QWEN05)
    unplanned = make_plan(get_profile("p40"), config(1, 256, 256, 1, 1, 1, **{key: 8}), PLAIN, None)
    assert unplanned.rollout.micro_batch_size == 8


def test_training_batch_stays_one_pass_when_it_can_and_is_chunked_when_it_cannot():
    # (a V100-16GB: on a T4's 14.7 GiB the static KV cache, allocated whole before prefill, needs two passes)
    quick = make_plan(get_profile("v100-16gb"), QUICKSTART, PLAIN, QWEN05)
    assert quick.rollout.micro_batch_size >= 256                     # 256 prompts generated in one pass
    assert quick.actor.param_offload                                  # offloading bought that, as before
    huge = config(4096, 512, 512, 256, 4, 8)                          # 4,096 prompts never fit one pass
    plan = make_plan(get_profile("l4"), huge, PLAIN, QWEN05)
    assert plan.rollout.micro_batch_size < 1024
    assert plan.memory["required_gb"] <= get_profile("l4").memory_gb
    assert _rollout_required(plan, 4096, 512, 512) <= get_profile("l4").memory_gb


def test_token_budgets_are_bounded_by_the_mini_batch_the_planner_reads():
    """The GPU matrix on an H200: mini-batch 8 prompts x rollout.n 2 = 16 sequences of 384 tokens, so an
    update micro-batch under a 16384-token budget holds 16 sequences (the critic's own mini-batch: 4 x 2),
    and the prediction is that of fixed micro-batches of those sizes."""
    cfg = config(8, 256, 128, 8, 4, 8, actor_rollout_ref__actor__use_dynamic_bsz=True,
                 actor_rollout_ref__rollout__n=2, critic__ppo_mini_batch_size=4)
    plan = make_plan(get_profile("h200"), cfg, PLAIN, QWEN05)
    assert plan.actor.max_token_len_per_gpu >= 16384 and plan.actor.micro_batch_size_per_gpu is None
    fixed = {name: dataclasses.replace(r, micro_batch_size_per_gpu=rows, forward_micro_batch_size_per_gpu=16)
             for name, r, rows in (("actor", plan.actor, 16), ("critic", plan.critic, 8), ("ref", plan.ref, 16))
             if r is not None}
    wl = Workload(256, 128, 16, update_batch_per_gpu=16, critic_update_batch_per_gpu=8)
    est = estimate_memory(QWEN05, wl, fixed["actor"], plan.rollout, fixed.get("critic"),
                          fixed.get("ref"), device_memory_gb=plan.memory_limit_gb, fragmentation=0.1,
                          compiled_layers=plan.torch_compile)
    for phase in ("actor_update", "critic_update", "log_prob", "values"):
        want = {k: round(v, 4) for k, v in est.phases[phase].terms.items()}
        assert plan.memory["phases"][phase] == want, phase


@pytest.mark.parametrize("device", ["a100-80gb", "h200"])
def test_torch_compile_where_triton_runs_names_the_layers_and_the_first_step_cost(device):
    """The printed reason says what the workers compile (verl.workers.model_building.layer_compile, the chunk kernels) and
    what it costs once; without a usable triton the same device plans no compile."""
    plan = make_plan(get_profile(device), QUICKSTART, PLAIN, QWEN05)
    why = plan.reasons["torch_compile"]
    assert plan.torch_compile and why.startswith("triton usable here")
    assert "decoder layer of the actor, ref and critic" in why and "first step" in why
    on = config(256, 512, 512, 64, 4, 8, actor_rollout_ref__actor__use_torch_compile=True)
    asked = make_plan(get_profile(device), on, PLAIN, QWEN05)
    assert asked.torch_compile and "decoder layer" in asked.reasons["torch_compile"]
    off = make_plan(get_profile(device), QUICKSTART, dataclasses.replace(PLAIN, triton_usable=False), QWEN05)
    assert not off.torch_compile and "decoder layer" not in off.reasons["torch_compile"]

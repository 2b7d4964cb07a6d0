"""The planner's LoRA rules: adapters from the config, the reference served by the actor, the frozen
storage dtype per device, the 4-bit base and 8-bit AdamW where bitsandbytes supports the device."""
import dataclasses

import pytest

from verl.compat.device.catalog import CATALOG
from verl.compat.device.support import bitsandbytes_missing
from verl.compat.planning.model_spec import BUILTIN_MODELS, ModelSpec
from verl.compat.planning.planner import PlanError, make_plan
from verl.compat.device.profile import SoftwareInfo
from verl.trainer.config_check import ConfigError, load_config

from tests.compat.test_planner import config

QWEN05 = ModelSpec.from_hf_config(BUILTIN_MODELS["qwen2.5-0.5b"])
PEFT = SoftwareInfo(torch_version="2.11.0", triton_usable=True, peft_version="0.17.0")
BNB = dataclasses.replace(PEFT, bitsandbytes_version="0.48.2")


def grpo(**extra):
    """The issue's GRPO shape (8 prompts x 4 samples, KL loss) plus `extra` (path__to__key=value)."""
    shape = {"algorithm__adv_estimator": "grpo", "actor_rollout_ref__actor__use_kl_loss": True,
             "actor_rollout_ref__rollout__n": 4}
    return config(8, 256, 256, 8, "auto", "auto", **{**shape, **extra})


LORA = {"actor_rollout_ref__model__lora_rank": 32}


def test_lora_rank_is_read_and_the_actor_serves_the_reference():
    plan = make_plan(CATALOG["a100-40gb"], grpo(**LORA), PEFT, QWEN05)
    assert plan.actor.lora_rank == 32
    assert plan.ref_in_actor is True and plan.ref is None
    assert "adapters disabled" in plan.reasons["ref_in_actor"]
    full = make_plan(CATALOG["a100-40gb"], grpo(), PEFT, QWEN05)
    assert full.actor.lora_rank == 0 and full.ref_in_actor is False and full.ref is not None
    assert full.actor.frozen_dtype is None          # nothing frozen in the actor


def test_lora_without_a_reference_keeps_ref_in_actor_off():
    cfg = grpo(**LORA, actor_rollout_ref__actor__use_kl_loss=False)
    plan = make_plan(CATALOG["a100-40gb"], cfg, PEFT, QWEN05)
    assert plan.actor.lora_rank == 32 and plan.ref is None and plan.ref_in_actor is False


def test_critic_lora_rank_is_read_from_the_critic_model():
    cfg = config(8, 256, 256, 8, "auto", "auto", critic__model__lora_rank=16)
    plan = make_plan(CATALOG["a100-40gb"], cfg, PEFT, QWEN05)
    assert plan.critic.lora_rank == 16 and plan.actor.lora_rank == 0
    assert plan.critic.frozen_dtype == "bfloat16"


@pytest.mark.parametrize("device,frozen", [("p40", "float16"), ("p100", "float16"), ("t4", "float16"),
                                           ("v100-32gb", "float16"), ("rtx3090", "bfloat16"),
                                           ("a100-40gb", "bfloat16"), ("mi300x", "bfloat16"), ("cpu", "float32")])
def test_frozen_dtype_per_device(device, frozen):
    """float16 storage where compute is float32 for want of bfloat16 (P40-class), else the compute dtype."""
    lora = make_plan(CATALOG[device], grpo(**LORA), PEFT, QWEN05)
    assert lora.actor.frozen_dtype == frozen
    assert lora.actor.param_dtype == "float32"      # the adapters train with float32 master weights
    why = lora.reasons["actor.frozen_dtype"]
    if device in ("p40", "p100"):
        assert lora.actor.compute_dtype == "float32" and "upcast to float32 layer by layer" in why
    full = make_plan(CATALOG[device], grpo(), PEFT, QWEN05)
    # a separate reference model: the same rule, except the float16 numerics guard keeps it float32
    expected_ref = "float32" if full.ref.numerics_guard else frozen
    assert full.ref.frozen_dtype == expected_ref


def test_user_reference_dtype_is_kept():
    cfg = grpo(actor_rollout_ref__ref__fsdp_config__model_dtype="float32")
    plan = make_plan(CATALOG["p40"], cfg, PEFT, QWEN05)
    assert plan.ref.frozen_dtype == "float32" and "set by the user" in plan.reasons["ref.frozen_dtype"]


def test_bad_lora_rank_names_the_key():
    with pytest.raises(PlanError, match=r"actor_rollout_ref.model.lora_rank='many' must be a whole number"):
        make_plan(CATALOG["t4"], grpo(actor_rollout_ref__model__lora_rank="many"), PEFT, QWEN05)


def test_lora_without_peft_says_what_to_install():
    with pytest.raises(PlanError, match=r"lora_rank=32 .* peft is not installed: pip install peft"):
        make_plan(CATALOG["t4"], grpo(**LORA), SoftwareInfo(torch_version="2.11.0"), QWEN05)


# ----------------------------------------------------------------------------- bitsandbytes

FOUR_BIT = {**LORA, "actor_rollout_ref__model__load_in_4bit": True}
EIGHT_BIT = {"actor_rollout_ref__actor__optim__optimizer_impl": "bitsandbytes.optim",
             "actor_rollout_ref__actor__optim__optimizer": "AdamW8bit"}


@pytest.mark.parametrize("device", ["p40", "p100", "t4", "v100-16gb", "rtx3090", "a100-40gb", "h200"])
def test_4bit_base_and_8bit_adamw_where_bitsandbytes_supports_the_device(device):
    plan = make_plan(CATALOG[device], grpo(**FOUR_BIT, **EIGHT_BIT), BNB, QWEN05)
    assert plan.actor.base_quantization == "nf4" and plan.actor.optimizer_8bit is True
    assert "NF4" in plan.reasons["actor.base_quantization"] and not plan.warnings


def test_bitsandbytes_support_table():
    """sm_60+ on NVIDIA from 0.48 (sm_50+ before), 4-bit only on CPU, nothing planned on ROCm."""
    p40, cpu, mi300x = CATALOG["p40"], CATALOG["cpu"], CATALOG["mi300x"]
    maxwell = dataclasses.replace(p40, compute_capability=(5, 2))
    assert bitsandbytes_missing(p40, "0.48.2", "nf4") is None
    assert "compute capability 6.0" in bitsandbytes_missing(maxwell, "0.48.2", "adamw8bit")
    assert bitsandbytes_missing(maxwell, "0.45.5", "adamw8bit") is None
    assert bitsandbytes_missing(cpu, "0.48.2", "nf4") is None
    assert "no 8-bit optimizers on CPU" in bitsandbytes_missing(cpu, "0.48.2", "adamw8bit")
    assert "experimental" in bitsandbytes_missing(mi300x, "0.48.2", "nf4")
    assert "not installed" in bitsandbytes_missing(p40, None, "nf4")


def test_unsupported_bitsandbytes_is_adapted_with_a_reason_or_refused_when_strict():
    plan = make_plan(CATALOG["t4"], grpo(**FOUR_BIT, **EIGHT_BIT), PEFT, QWEN05)   # bitsandbytes missing
    assert plan.actor.base_quantization is None and plan.actor.optimizer_8bit is False
    assert any("load_in_4bit=True is not possible on t4" in w and "pip install bitsandbytes" in w
               for w in plan.warnings)
    assert any("optimizer_impl=bitsandbytes.optim" in w for w in plan.warnings)
    strict = grpo(**FOUR_BIT, compat__strict=True)
    with pytest.raises(PlanError, match=r"load_in_4bit=True is not possible on mi300x: .*experimental"):
        make_plan(CATALOG["mi300x"], strict, BNB, QWEN05)
    cpu = make_plan(CATALOG["cpu"], grpo(**FOUR_BIT, **EIGHT_BIT), BNB, QWEN05)
    assert cpu.actor.base_quantization == "nf4" and cpu.actor.optimizer_8bit is False


def test_4bit_base_needs_lora():
    with pytest.raises(PlanError, match=r"load_in_4bit=true .* set actor_rollout_ref.model.lora_rank"):
        make_plan(CATALOG["t4"], grpo(actor_rollout_ref__model__load_in_4bit=True), BNB, QWEN05)


def test_only_torch_adamw_or_bitsandbytes_adamw8bit_is_built():
    cfg = grpo(actor_rollout_ref__actor__optim__optimizer_impl="torchao.optim",
               actor_rollout_ref__actor__optim__optimizer="_AdamW")
    with pytest.raises(PlanError, match=r"optimizer_impl=torchao.optim .* AdamW8bit from bitsandbytes.optim"):
        make_plan(CATALOG["t4"], cfg, BNB, QWEN05)


def test_config_checks_the_new_key():
    base = ["actor_rollout_ref.actor.use_dynamic_bsz=true"]
    cfg = load_config([*base, "actor_rollout_ref.model.lora_rank=32", "actor_rollout_ref.model.load_in_4bit=true"])
    assert cfg.actor_rollout_ref.model.load_in_4bit is True and cfg.actor_rollout_ref.model.lora_rank == 32
    assert load_config(base).actor_rollout_ref.model.load_in_4bit is False
    with pytest.raises(ConfigError, match=r"load_in_4bit=true .* set actor_rollout_ref.model.lora_rank"):
        load_config([*base, "actor_rollout_ref.model.load_in_4bit=true"])
    with pytest.raises(ConfigError, match=r"load_in_4bit='maybe' must be true or false"):
        load_config([*base, "actor_rollout_ref.model.load_in_4bit=maybe"])
    with pytest.raises(ConfigError, match=r"critic.model.lora_rank=-1 must be a whole number"):
        load_config([*base, "critic.model.lora_rank=-1"])

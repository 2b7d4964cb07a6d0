"""Issue 25's goal table through the real config and the real planner: the GRPO shape (8 prompts x 4 samples
x (256 + 256) tokens, KL loss, one device) plans for every cell; refusals only where the memory model says
so, each naming the LoRA or QLoRA setting that would fit and its peak."""
import dataclasses

import pytest

from verl.compat.device.catalog import CATALOG
from verl.compat.planning.decider import MemoryShortfall
from verl.compat.planning.model_spec import BUILTIN_MODELS, ModelSpec
from verl.compat.planning.modes import largest_models, mode_rows
from verl.compat.planning.planner import make_plan
from verl.compat.device.profile import SoftwareInfo
from verl.trainer.config_check import load_config

SOFTWARE = SoftwareInfo(torch_version="2.11.0", triton_usable=True, peft_version="0.17.0",
                        bitsandbytes_version="0.48.2")
# the shape as stock overrides (the lead's H200 commands add the model path, compat.device and the steps)
GRPO = ["algorithm.adv_estimator=grpo", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=4",
        "data.max_prompt_length=256", "data.max_response_length=256", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=1", "trainer.nnodes=1"]
LORA = ["actor_rollout_ref.model.lora_rank=32"]
QLORA = [*LORA, "actor_rollout_ref.model.load_in_4bit=true"]


def spec(name: str) -> ModelSpec:
    return ModelSpec.from_hf_config(BUILTIN_MODELS[name])


def plan(device: str, model: str, extra=(), software=SOFTWARE):
    return make_plan(CATALOG[device], load_config([*GRPO, *extra]), software, spec(model))


# (device, model, overrides, param offload expected)
CELLS = [
    ("p40", "qwen2.5-1.5b", [], True),
    ("p40", "qwen2.5-3b", [], True),
    ("p40", "qwen2.5-7b", LORA, False),
    ("t4", "qwen2.5-1.5b", [], True),
    ("t4", "qwen2.5-7b", QLORA, False),
    ("rtx3090", "qwen2.5-3b", [], True),
    ("rtx3090", "qwen2.5-7b", LORA, False),
    ("a100-40gb", "qwen2.5-7b", [], True),
]


@pytest.mark.parametrize("device,model,extra,offloaded", CELLS, ids=[f"{c[0]}-{c[1]}-{len(c[2])}" for c in CELLS])
def test_every_goal_cell_plans(device, model, extra, offloaded):
    p = plan(device, model, extra)
    assert p.memory["required_gb"] <= CATALOG[device].memory_gb and not p.warnings
    assert p.actor.param_offload is offloaded
    if extra:
        assert p.actor.lora_rank == 32 and p.ref is None and p.ref_in_actor and "ref" in p.memory["phases"]
        assert p.actor.fsdp is False                       # LoRA on one device: the base is read where stored
        assert p.actor.base_quantization == ("nf4" if extra == QLORA else None)
        assert p.actor.frozen_dtype == {"p40": "float16", "t4": "float16", "rtx3090": "bfloat16"}[device]
    else:
        assert p.actor.lora_rank == 0 and p.ref is not None and not p.ref_in_actor
        # the separate reference is stored in float16 where compute is float32 (P40)
        assert p.ref.frozen_dtype == {"p40": "float16", "t4": "float32"}.get(device, "bfloat16")


@pytest.mark.parametrize("device,extra,lever", [
    ("p40", [], "actor_rollout_ref.model.lora_rank=32,"),
    ("rtx3090", ["actor_rollout_ref.actor.fsdp_config.param_offload=false"], "actor_rollout_ref.model.lora_rank=32,"),
    ("t4", [], "actor_rollout_ref.model.lora_rank=32 actor_rollout_ref.model.load_in_4bit=true"),
    ("t4", LORA, "actor_rollout_ref.model.load_in_4bit=true"),
])
def test_7b_refusals_name_the_lever_that_fits_and_its_peak(device, extra, lever):
    with pytest.raises(MemoryShortfall) as err:
        plan(device, "qwen2.5-7b", extra)
    msg = str(err.value)
    assert "GiB more than the device has" in msg and lever in msg
    assert "predicted peak" in msg and "does not switch it on by itself" in msg
    mode = "QLoRA" if "load_in_4bit" in lever else "LoRA"
    lever_plan = plan(device, "qwen2.5-7b", QLORA if mode == "QLoRA" else LORA)
    assert f"predicted peak {lever_plan.predicted_peak_gb:.2f} GiB" in msg


def test_lora_is_never_switched_on_by_the_planner():
    """However short the memory, the fit stays with full training (the lever is only named)."""
    small = dataclasses.replace(CATALOG["p40"], memory_gb=12.0)
    with pytest.raises(MemoryShortfall, match="LoRA would fit"):
        make_plan(small, load_config(GRPO), SOFTWARE, spec("qwen2.5-3b"))


def test_a_refusal_without_peft_still_names_the_lever_and_what_to_install():
    bare = SoftwareInfo(torch_version="2.11.0")
    with pytest.raises(MemoryShortfall, match=r"lora_rank=32 \(needs peft installed\)"):
        plan("p40", "qwen2.5-7b", software=bare)


def test_no_lever_is_named_where_none_would_fit():
    tiny = dataclasses.replace(CATALOG["t4"], memory_gb=4.0)
    with pytest.raises(MemoryShortfall) as err:
        make_plan(tiny, load_config(GRPO), SOFTWARE, spec("qwen2.5-7b"))
    assert "would fit:" not in str(err.value)


def test_modes_for_7b_on_a_p40():
    rows = {r.mode: r for r in mode_rows(CATALOG["p40"], load_config(GRPO), SOFTWARE, spec("qwen2.5-7b"))}
    assert not rows["full"].fits and not rows["full + offload"].fits
    assert rows["LoRA"].fits and rows["QLoRA"].fits and rows["QLoRA"].peak_gb < rows["LoRA"].peak_gb
    assert "float16 base" in rows["LoRA"].settings and "4-bit base" in rows["QLoRA"].settings


def test_qlora_mode_says_why_not_where_bitsandbytes_does_not_plan_it():
    rows = {r.mode: r for r in mode_rows(CATALOG["mi300x"], load_config(GRPO), SOFTWARE, spec("qwen2.5-7b"))}
    assert not rows["QLoRA"].fits and "experimental" in rows["QLoRA"].why_not


def test_largest_model_per_mode_on_the_goal_devices():
    """The docs' table (docs/compat.md) for the goal devices: the planner's answer for the GRPO shape."""
    config = load_config(GRPO)
    assert largest_models(CATALOG["p40"], config, SOFTWARE) == {
        "full": "qwen2.5-0.5b", "full + offload": "qwen2.5-3b", "LoRA": "qwen2.5-7b", "QLoRA": "qwen2.5-7b"}
    assert largest_models(CATALOG["t4"], config, SOFTWARE)["QLoRA"] == "qwen2.5-7b"
    assert largest_models(CATALOG["a100-40gb"], config, SOFTWARE)["full + offload"] == "qwen2.5-7b"


def test_docs_table_of_the_largest_model_is_the_planners_answer():
    """docs/compat.md's table, for the goal devices, equals what the planner answers today (regenerate it
    with `python -m verl.compat --largest ...` when the memory model changes)."""
    from pathlib import Path

    from verl.compat.planning.modes import largest_table

    docs = (Path(__file__).resolve().parents[2] / "docs" / "compat.md").read_text()
    rows = largest_table(load_config(GRPO), SOFTWARE, ["p40", "t4", "rtx3090", "a100-40gb"]).splitlines()[2:]
    assert all(f"\n{row}\n" in docs for row in rows), rows


def test_offloaded_full_fine_tune_takes_the_largest_micro_batch_that_fits():
    """Under param offload every pass streams all weights host -> device (forward and backward), so the p40
    1.5B plan runs its update and log-prob passes on as many sequences as fit, not one, within the cap."""
    p = plan("p40", "qwen2.5-1.5b")
    seq_len = 512
    assert p.actor.param_offload and p.actor.use_dynamic_bsz
    assert p.actor.max_token_len_per_gpu // seq_len > 1 and p.actor.forward_max_token_len_per_gpu // seq_len > 1
    assert p.memory["required_gb"] <= CATALOG["p40"].memory_gb
    est_phases = p.memory["phases"]
    assert max(sum(t.values()) for t in est_phases.values()) == pytest.approx(p.predicted_peak_gb, abs=1e-3)


def test_a_halved_budget_grows_back_where_parameters_are_offloaded():
    """The fit halves every budget together until the update fits; where the role's parameters are offloaded,
    each configured budget then grows back towards its setting on its own, with the reason."""
    big = ["actor_rollout_ref.rollout.n=16", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=65536",
           "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=65536"]
    p = plan("t4", "qwen2.5-1.5b", big)
    assert p.actor.param_offload and p.memory["required_gb"] <= CATALOG["t4"].memory_gb
    assert p.actor.max_token_len_per_gpu < 65536 and "halved" in p.reasons["actor.max_token_len_per_gpu"]
    assert p.actor.forward_max_token_len_per_gpu > p.actor.max_token_len_per_gpu
    assert "parameters are offloaded" in p.reasons["actor.forward_max_token_len_per_gpu"]

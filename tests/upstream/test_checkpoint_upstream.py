"""Upstream's checkpoint API: `BaseCheckpointManager`, `checkpoint.save_lora_only` on a real peft LoRA model
(the shard holds the adapters alone and loads over the live base weights), and the driver-side
`trainer.checkpoint_callback_class` hook called after a complete save."""
import os

import pytest
import torch
from omegaconf import OmegaConf

from verl.trainer.ppo.checkpoint_callback import CheckpointCallback, build_checkpoint_callback
from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager


def test_base_manager_reads_contents_and_save_lora_only():
    plain = BaseCheckpointManager(model=None, optimizer=None)
    assert (plain.should_save_model, plain.should_save_hf_model, plain.should_save_lora_only) == (True, False, False)
    cfg = OmegaConf.create({"save_contents": ["model", "hf_model"], "load_contents": ["optimizer"],
                            "save_lora_only": True})
    mgr = BaseCheckpointManager(model=None, optimizer=None, checkpoint_config=cfg)
    assert (mgr.should_save_hf_model, mgr.should_save_optimizer, mgr.should_load_optimizer,
            mgr.should_load_model, mgr.should_save_lora_only) == (True, False, True, False, True)
    assert BaseCheckpointManager.is_lora_only_state_dict({"a.lora_A.default.weight": 0, "b.adapter_B.w": 0})
    assert not BaseCheckpointManager.is_lora_only_state_dict({"a.lora_A.weight": 0, "a.base_layer.weight": 0})
    assert not BaseCheckpointManager.is_lora_only_state_dict({})


def _lora_model(seed):
    pytest.importorskip("peft")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl.utils import lora

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    cfg = {"lora_rank": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "exclude_modules": None,
           "lora_adapter_path": None}
    model = lora.add_adapters(Qwen2ForCausalLM(config), cfg, rank=4, trainable_dtype=torch.float32, seed=seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_()   # B starts at 0: make the adapters matter
    return model


def test_save_lora_only_writes_adapters_and_loads_them_over_the_base(tmp_path):
    trained = _lora_model(seed=1)
    FSDPCheckpointManager(trained, checkpoint_config={"save_contents": ["model"], "save_lora_only": True}) \
        .save_checkpoint(str(tmp_path / "lora"))
    FSDPCheckpointManager(trained, checkpoint_config={"save_contents": ["model"]}).save_checkpoint(str(tmp_path / "full"))
    shard = torch.load(tmp_path / "lora" / "model_world_size_1_rank_0.pt", weights_only=False)
    full = torch.load(tmp_path / "full" / "model_world_size_1_rank_0.pt", weights_only=False)
    adapters = {k for k in full if ".lora_A." in k or ".lora_B." in k}
    assert set(shard) == adapters and len(adapters) == 4 and len(full) > len(shard)

    other = _lora_model(seed=2)   # another base and other adapters
    base_before = {k: v.clone() for k, v in other.state_dict().items() if "lora_" not in k}
    FSDPCheckpointManager(other, checkpoint_config={"load_contents": ["model"]}).load_checkpoint(str(tmp_path / "lora"))
    state, source = other.state_dict(), trained.state_dict()
    for name, value in state.items():
        if "lora_" in name:
            assert torch.equal(value, source[name]), name
        else:
            assert torch.equal(value, base_before[name]), name   # the base weights stay the live model's

    plain_cfg = {"save_contents": ["model"], "save_lora_only": True}
    from transformers import Qwen2Config, Qwen2ForCausalLM

    dense = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    FSDPCheckpointManager(dense, checkpoint_config=plain_cfg).save_checkpoint(str(tmp_path / "dense"))
    kept = torch.load(tmp_path / "dense" / "model_world_size_1_rank_0.pt", weights_only=False)
    assert set(kept) == set(dense.state_dict())   # no adapters: save_lora_only keeps everything


def test_a_lora_only_shard_for_other_adapters_is_refused(tmp_path):
    trained = _lora_model(seed=1)
    FSDPCheckpointManager(trained, checkpoint_config={"save_contents": ["model"], "save_lora_only": True}) \
        .save_checkpoint(str(tmp_path / "lora"))
    path = tmp_path / "lora" / "model_world_size_1_rank_0.pt"
    shard = torch.load(path, weights_only=False)
    shard["base_model.model.model.layers.0.mlp.up_proj.lora_A.default.weight"] = torch.zeros(4, 16)
    torch.save(shard, path)
    with pytest.raises(KeyError, match="same adapters"):
        FSDPCheckpointManager(_lora_model(seed=3), checkpoint_config={"load_contents": ["model"]}) \
            .load_checkpoint(str(tmp_path / "lora"))


class Recorder(CheckpointCallback):
    calls = []

    def on_save(self, trainer, global_step, checkpoint_dir, async_save=False, **kwargs):
        Recorder.calls.append((global_step, checkpoint_dir, async_save,
                               sorted(os.listdir(os.path.dirname(checkpoint_dir)))))


def test_checkpoint_callback_is_built_from_the_config_and_called_after_a_complete_save(tmp_path):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    assert type(build_checkpoint_callback(OmegaConf.create({"trainer": {"checkpoint_callback_class": None}}))) \
        is CheckpointCallback
    with pytest.raises(ImportError, match="trainer.checkpoint_callback_class"):
        build_checkpoint_callback(OmegaConf.create({"trainer": {"checkpoint_callback_class": "no_such.Module"}}))
    config = OmegaConf.create({"trainer": {"checkpoint_callback_class": f"{__name__}.Recorder",
                                           "default_local_dir": str(tmp_path), "max_actor_ckpt_to_keep": None,
                                           "max_critic_ckpt_to_keep": None}})
    callback = build_checkpoint_callback(config)
    assert isinstance(callback, Recorder) and callback.config is config

    class ActorGroup:
        def save_checkpoint(self, path, hdfs_path, step, max_ckpt_to_keep=None):
            os.makedirs(path)
            open(os.path.join(path, "model_world_size_1_rank_0.pt"), "wb").close()

    class Sampler:
        def state_dict(self, epoch, batches_done):
            return {"epoch": epoch, "batches_done": batches_done}

    trainer = RayPPOTrainer.__new__(RayPPOTrainer)   # only the save path of the trainer
    trainer.config, trainer.global_steps, trainer.use_critic = config, 3, False
    trainer.actor_rollout_wg, trainer.train_sampler, trainer.checkpoint_callback = ActorGroup(), Sampler(), callback
    Recorder.calls.clear()
    trainer._save_checkpoint(epoch=0, batches_done=3)
    folder = str(tmp_path / "global_step_3")
    # called once, after the tracker names the step
    assert Recorder.calls == [(3, folder, False, ["global_step_3", "latest_checkpointed_iteration.txt"])]

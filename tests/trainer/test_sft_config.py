"""The SFT trainer's config: upstream's engine/optim group choices, its step frequencies, torchrun's ranks."""
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from verl.trainer.config.groups import sft_sections


def test_sft_composes_upstreams_engine_and_optim_groups():
    """sft_trainer_engine composes engine/fsdp and optim/fsdp (written from its own sections): the composed config
    equals the file's sections, and upstream's `engine=fsdp optim=fsdp` select the groups, after which their keys
    take overrides (before the groups existed, `optim=fsdp` replaced the section by a string)."""
    with initialize_config_module("verl.trainer.config", version_base=None):
        plain = compose("sft_trainer_engine")
        chosen = compose("sft_trainer_engine", overrides=["engine=fsdp", "optim=fsdp", "optim.lr=1e-5",
                                                          "optim.betas=[0.9,0.95]", "engine.strategy=fsdp"])
    assert OmegaConf.to_container(plain) == OmegaConf.to_container(sft_sections())
    assert chosen.optim.lr == 1e-5 and list(chosen.optim.betas) == [0.9, 0.95] and chosen.engine.strategy == "fsdp"
    assert chosen.model == plain.model and chosen.data == plain.data


def test_sft_frequencies_take_steps_or_after_each_epoch(monkeypatch):
    """trainer.test_freq / save_freq: a step count or upstream's `after_each_epoch`; anything else is a config problem
    naming the key. Under torchrun the ranks' count replaces trainer.nnodes x n_gpus_per_node."""
    from verl.trainer.sft_trainer import config_problems, follow_launcher

    with initialize_config_module("verl.trainer.config", version_base=None):
        good = compose("sft_trainer_engine", overrides=["trainer.test_freq=after_each_epoch", "trainer.save_freq=5"])
        bad = compose("sft_trainer_engine", overrides=["trainer.test_freq=weekly"])
    assert config_problems(good) == []
    assert config_problems(bad) == ["trainer.test_freq='weekly': a number of steps (-1 for never) or after_each_epoch"]
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    follow_launcher(good)
    assert (good.trainer.nnodes, good.trainer.n_gpus_per_node) == (2, 2)

"""The Hydra config: upstream commands parse, overrides behave as upstream, unknown keys fail early."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl.trainer import config_check
from verl.trainer.config_check import ConfigError, check_overrides, load_config

ROOT = Path(__file__).resolve().parents[2]

# Upstream's PPO quick start (docs/start/quickstart.rst, Qwen2.5-0.5B-Instruct on GSM8K), as written.
QUICKSTART_PPO = [
    "data.train_files=$HOME/data/gsm8k/train.parquet",
    "data.val_files=$HOME/data/gsm8k/test.parquet",
    "data.train_batch_size=256",
    "data.max_prompt_length=512",
    "data.max_response_length=512",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "critic.optim.lr=1e-5",
    "critic.model.path=Qwen/Qwen2.5-0.5B-Instruct",
    "critic.ppo_micro_batch_size_per_gpu=4",
    "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.logger=console",
    "trainer.val_before_train=False",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "trainer.save_freq=10",
    "trainer.test_freq=10",
    "trainer.total_epochs=15",
]

# Upstream's GRPO GSM8K example (examples/grpo_trainer/run_qwen2-7b.sh), as written.
GRPO_GSM8K = [
    "algorithm.adv_estimator=grpo",
    "data.train_files=$HOME/data/gsm8k/train.parquet",
    "data.val_files=$HOME/data/gsm8k/test.parquet",
    "data.train_batch_size=1024",
    "data.max_prompt_length=512",
    "data.max_response_length=1024",
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=['console','wandb']",
    "trainer.project_name='verl_grpo_example_gsm8k'",
    "trainer.experiment_name='qwen2_7b_function_rm'",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=1",
    "trainer.save_freq=20",
    "trainer.test_freq=5",
    "trainer.total_epochs=15",
]

# The field report's P40 command: its two offload keys are not real; everything else is.
FIELD_REPORT_BAD_KEYS = [
    "actor_rollout_ref.fsdp_config.cpu_offload=true",
    "actor_rollout_ref.fsdp_config.offload_params=true",
]


def test_quickstart_ppo_parses_with_upstream_values():
    cfg = load_config(QUICKSTART_PPO)
    assert cfg.data.train_batch_size == 256
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert cfg.actor_rollout_ref.rollout.name == "vllm"
    assert cfg.actor_rollout_ref.rollout.gpu_memory_utilization == 0.4
    assert cfg.critic.optim.lr == pytest.approx(1e-5)
    assert cfg.trainer.logger == "console"
    assert cfg.trainer.val_before_train is False
    # interpolations resolve as upstream: the rollout lengths follow data.*
    assert cfg.actor_rollout_ref.rollout.response_length == 512
    assert cfg.critic.ppo_mini_batch_size == 64
    # hardware keys the command leaves alone stay auto for verl.compat
    assert cfg.actor_rollout_ref.actor.fsdp_config.dtype == "auto"
    assert cfg.actor_rollout_ref.actor.fsdp_config.param_offload == "auto"
    assert cfg.actor_rollout_ref.model.attn_implementation == "auto"
    assert cfg.trainer.device == "auto"
    OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves


def test_grpo_example_parses_with_upstream_values():
    cfg = load_config(GRPO_GSM8K)
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.actor_rollout_ref.rollout.n == 5
    assert cfg.actor_rollout_ref.actor.rollout_n == 5
    assert cfg.actor_rollout_ref.actor.fsdp_config.param_offload is False
    assert cfg.actor_rollout_ref.ref.fsdp_config.param_offload is True
    assert cfg.actor_rollout_ref.model.use_remove_padding is True
    assert cfg.actor_rollout_ref.actor.use_remove_padding is True
    assert list(cfg.trainer.logger) == ["console", "wandb"]
    assert cfg.data.truncation == "error"
    assert not config_check.need_critic(cfg) and config_check.need_reference_policy(cfg)


def test_defaults_keep_upstream_values_except_hardware_keys():
    cfg = load_config(check=False)
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 256
    assert cfg.actor_rollout_ref.actor.clip_ratio == 0.2
    assert cfg.actor_rollout_ref.actor.loss_agg_mode == "token-mean"
    assert cfg.actor_rollout_ref.actor.kl_loss_type == "low_var_kl"
    assert cfg.algorithm.adv_estimator == "gae" and cfg.algorithm.gamma == 1.0
    assert cfg.critic.cliprange_value == 0.5
    assert cfg.trainer.total_epochs == 30 and cfg.trainer.n_gpus_per_node == 8
    autos = {
        "actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.dtype",
        "actor_rollout_ref.rollout.gpu_memory_utilization", "actor_rollout_ref.rollout.enforce_eager",
        "actor_rollout_ref.model.attn_implementation", "actor_rollout_ref.model.use_remove_padding",
        "actor_rollout_ref.actor.use_torch_compile", "critic.model.attn_implementation",
        "critic.model.use_remove_padding", "trainer.device",
        # token budgets: compat starts from upstream's 16384 / 32768 and may grow them
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "critic.ppo_max_token_len_per_gpu",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", "critic.forward_max_token_len_per_gpu",
    }
    for fsdp in ("actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.fsdp"):
        autos |= {f"{fsdp}.{k}" for k in ("param_offload", "optimizer_offload", "model_dtype", "dtype",
                                          "use_torch_compile", "mixed_precision.param_dtype",
                                          "mixed_precision.reduce_dtype", "mixed_precision.buffer_dtype")}
    for key in autos:
        assert OmegaConf.select(cfg, key) == "auto", key
    assert dict(cfg.compat) == {"device": None, "strict": False, "numerics_guard": True, "memory_margin": 0.1,
                                "always_fsdp": False, "compile_warmup": "auto", "compile_cache_dir": "auto"}


def test_compat_device_follows_environment(monkeypatch):
    monkeypatch.setenv("VERL_COMPAT_DEVICE", "p40")
    assert load_config(check=False).compat.device == "p40"
    assert load_config(["compat.device=t4"], check=False).compat.device == "t4"


@pytest.mark.skipif(not Path("/tmp/upstream/src/verl/trainer/config/_generated_ppo_trainer.yaml").exists(),
                    reason="needs upstream verl 0.9.1's source unpacked at /tmp/upstream")
def test_every_upstream_key_is_accepted():
    upstream = OmegaConf.load("/tmp/upstream/src/verl/trainer/config/_generated_ppo_trainer.yaml")
    ours = set(config_check.all_paths())
    missing = [p for p in config_check._leaf_paths(upstream) if "_target_" not in p and p not in ours]
    assert missing == []


# ---------------------------------------------------------------------------------------- overrides

def test_plus_adds_a_new_key_and_plus_on_existing_key_overrides():
    cfg = load_config(QUICKSTART_PPO + [
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",  # exists here, not upstream
        "++trainer.project_name=p",
    ])
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "eager"
    # upstream's spelling of the attention choice becomes the fork's explicit setting
    assert cfg.actor_rollout_ref.model.attn_implementation == "eager"
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space == 4
    assert cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "fp32"
    assert cfg.trainer.project_name == "p"


def test_plus_on_existing_key_is_rewritten_for_hydra():
    args, warnings = check_overrides(["+data.train_batch_size=8", "data.seed=1", "++x.y=1"])
    assert args == ["++data.train_batch_size=8", "data.seed=1", "++x.y=1"]
    assert warnings == []


def test_plus_with_an_unread_new_key_warns():
    args, warnings = check_overrides(["+actor_rollout_ref.rollout.enable_sleep_mode=False"])
    assert args == ["+actor_rollout_ref.rollout.enable_sleep_mode=False"]
    assert "enable_sleep_mode" in warnings[0]


def test_hydra_flags_pass_through_unchecked():
    args, _ = check_overrides(["--cfg", "job", "hydra.run.dir=/tmp/x", "data.seed=3"])
    assert args == ["--cfg", "job", "hydra.run.dir=/tmp/x", "data.seed=3"]


def test_delete_of_unknown_key_is_an_error():
    check_overrides(["~data.seed"])
    with pytest.raises(ConfigError, match="data.sead"):
        check_overrides(["~data.sead"])


def test_bare_word_is_not_an_override():
    with pytest.raises(ConfigError, match="key=value"):
        check_overrides(["train"])


# ------------------------------------------------------------------------------------- unknown keys

def test_field_report_offload_keys_point_to_param_offload():
    with pytest.raises(ConfigError) as info:
        check_overrides(QUICKSTART_PPO + FIELD_REPORT_BAD_KEYS)
    message = str(info.value)
    assert "'actor_rollout_ref.fsdp_config.cpu_offload' is not a config key" in message
    assert "actor_rollout_ref.actor.fsdp_config.param_offload=true" in message
    assert "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true" in message
    assert "'actor_rollout_ref.fsdp_config.offload_params' is not a config key" in message
    assert "actor_rollout_ref.ref.fsdp_config.param_offload" in message


@pytest.mark.parametrize("bad, good", [
    ("critic.model.fsdp_config.param_offload=False", "critic.fsdp.param_offload=False"),
    ("actor_rollout_ref.actor.fsdp_config.offload_optimizer=true",
     "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true"),
    ("actor_rollout_ref.actor.optim.learning_rate=1e-6", "actor_rollout_ref.actor.optim.lr=1e-6"),
])
def test_alias_table_says_what_to_write(bad, good):
    with pytest.raises(ConfigError, match=good.replace(".", r"\.")):
        check_overrides([bad])


def test_removed_grad_offload_says_delete_it():
    with pytest.raises(ConfigError, match="Delete this override"):
        check_overrides(["actor_rollout_ref.actor.fsdp_config.grad_offload=False"])


@pytest.mark.parametrize("typo, expected", [
    ("trainer.n_gpus=1", "trainer.n_gpus_per_node"),
    ("data.max_prompt_len=10", "data.max_prompt_length"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpuu=2",
     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
    ("algorithm.kl_coef=0.1", "algorithm.kl_ctrl.kl_coef"),
])
def test_typo_names_the_closest_real_key_first(typo, expected):
    with pytest.raises(ConfigError) as info:
        check_overrides([typo])
    lines = str(info.value).splitlines()
    assert lines[1] == "Closest real keys:"
    assert lines[2].strip() == expected


def test_plus_with_a_typo_of_an_existing_key_is_still_an_error():
    with pytest.raises(ConfigError, match="trainer.total_epochs"):
        check_overrides(["+trainer.total_epoch=3"])


def test_all_unknown_keys_are_reported_at_once():
    with pytest.raises(ConfigError) as info:
        check_overrides(["a.b=1", "trainer.n_gpus=1"])
    assert "'a.b'" in str(info.value) and "'trainer.n_gpus'" in str(info.value)


# ------------------------------------------------------------------------------------------- the CLI

def _run_cli(args, code, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120)


_PROBE = """
import sys
sys.argv = ["main_ppo"] + sys.argv[1:]
import verl.trainer.main_ppo as m
seen = {}
def fake_run_ppo(config, task_runner_class=None):
    seen["batch"] = config.data.train_batch_size
m.run_ppo = fake_run_ppo
code = 0
try:
    m.main()
except SystemExit as e:
    code = e.code
heavy = sorted(k for k in ("torch", "ray", "transformers") if k in sys.modules)
print("RESULT", code, seen.get("batch"), ",".join(heavy) or "-")
"""


def test_cli_unknown_key_exits_2_before_any_heavy_import(tmp_path):
    proc = _run_cli(QUICKSTART_PPO + FIELD_REPORT_BAD_KEYS, _PROBE, tmp_path)
    assert proc.stdout.split()[-4:] == ["RESULT", "2", "None", "-"]
    assert "actor_rollout_ref.actor.fsdp_config.param_offload=true" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_bad_batch_settings_exit_2_before_any_heavy_import(tmp_path):
    args = QUICKSTART_PPO + ["actor_rollout_ref.actor.ppo_mini_batch_size=512",
                             "hydra.run.dir=" + str(tmp_path), "hydra.output_subdir=null"]
    proc = _run_cli(args, _PROBE, tmp_path)
    assert proc.stdout.split()[-4:] == ["RESULT", "2", "None", "-"]
    assert "ppo_mini_batch_size=512 is larger than data.train_batch_size=256" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_valid_command_reaches_run_ppo_with_the_composed_config(tmp_path):
    args = QUICKSTART_PPO + ["hydra.run.dir=" + str(tmp_path), "hydra.output_subdir=null"]
    proc = _run_cli(args, _PROBE, tmp_path)
    assert proc.stdout.split()[-4:] == ["RESULT", "0", "256", "-"], proc.stderr


def test_config_yaml_ships_in_the_package():
    from importlib import resources
    names = {p.name for p in resources.files("verl.trainer").joinpath("config").iterdir()}
    assert {"ppo_trainer.yaml", "upstream_inert.yaml"} <= names


_OUTPUT_DIR_PROBE = """
import sys
sys.argv = ["main_ppo"] + sys.argv[1:]
import verl.trainer.main_ppo as m
def fake_run_ppo(config, task_runner_class=None):
    from hydra.core.hydra_config import HydraConfig
    print("OUTPUT_DIR", HydraConfig.get().runtime.output_dir)
m.run_ppo = fake_run_ppo
m.main()
"""


def test_concurrent_runs_get_their_own_hydra_output_folders(tmp_path):
    """Hydra's default folder has one-second resolution; runs started together must not share it."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", _OUTPUT_DIR_PROBE, *QUICKSTART_PPO], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    dirs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        dirs.append(next(line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("OUTPUT_DIR")))
    assert len(set(dirs)) == 3
    for folder in dirs:
        assert folder.startswith(str(tmp_path / "outputs")) and os.path.isfile(os.path.join(folder, ".hydra",
                                                                                                "config.yaml"))


def test_limit_images_is_a_rollout_key_as_in_upstreams_rollout_config():
    """Upstream's RolloutConfig has `limit_images` (its YAML leaves it out, scripts add it with +): here it is a key,
    read by the vLLM engine as `limit_mm_per_prompt`, so both spellings pass without an "unread key" warning."""
    for arg in ("actor_rollout_ref.rollout.limit_images=2", "+actor_rollout_ref.rollout.limit_images=2"):
        args, warnings = config_check.check_overrides([arg])
        assert warnings == [] and load_config([arg], check=False).actor_rollout_ref.rollout.limit_images == 2


def test_an_unknown_key_under_an_empty_section_says_how_to_add_it():
    message = config_check.unknown_key_message("actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space", "4")
    assert "'actor_rollout_ref.rollout.engine_kwargs.vllm' holds no keys by default." in message
    assert "write +actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=..." in message and "Keys under" not in message

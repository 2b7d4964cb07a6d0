"""The doctor, `python -m verl.compat`: the plan per device, its --json contract, its errors."""
import json
import os
import subprocess
import sys

import pytest

from verl.compat.__main__ import BUILTIN_MODELS, main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICKSTART = ["data.train_batch_size=256", "actor_rollout_ref.actor.ppo_mini_batch_size=64",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=auto",
              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=auto",
              "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=auto",
              "critic.ppo_micro_batch_size_per_gpu=auto", "trainer.n_gpus_per_node=1",
              "data.max_prompt_length=256", "data.max_response_length=256"]
ROLE_FIELDS = ("param_dtype", "compute_dtype", "attn_implementation", "param_offload",
               "optimizer_offload", "gradient_checkpointing")
DTYPES = {"float32", "float16", "bfloat16"}


@pytest.fixture(autouse=True)
def no_env_device(monkeypatch):
    monkeypatch.delenv("VERL_COMPAT_DEVICE", raising=False)


def doctor_json(capsys, device, *extra):
    code = main(["--json", "--device", device, "--model-spec", "qwen2.5-0.5b", *QUICKSTART, *extra])
    out = capsys.readouterr().out
    assert code == 0
    return json.loads(out)


def check_contract(out):
    assert isinstance(out["device"]["name"], str)
    for role in ("actor", "critic", "ref"):
        for field in ROLE_FIELDS:
            assert field in out[role], (role, field)
        assert out[role]["param_dtype"] in DTYPES and out[role]["compute_dtype"] in DTYPES
    for key in ("name", "dtype", "gpu_memory_utilization"):
        assert key in out["rollout"]
    assert out["rollout"]["dtype"] in DTYPES
    for key in ("torch_compile", "dist_backend", "use_remove_padding", "predicted_peak_gb", "reasons"):
        assert key in out
    assert out["reasons"] and all(isinstance(v, str) and v for v in out["reasons"].values())


def test_p40_plans_float32_sdpa_and_the_builtin_engine(capsys):
    out = doctor_json(capsys, "p40")
    check_contract(out)
    assert out["device"]["name"] == "p40" and out["device"]["compute_capability"] == [6, 1]
    for role in ("actor", "critic", "ref"):
        assert (out[role]["param_dtype"], out[role]["compute_dtype"]) == ("float32", "float32")
        assert out[role]["attn_implementation"] == "sdpa"
    assert (out["rollout"]["name"], out["rollout"]["dtype"]) == ("hf", "float32")
    assert out["torch_compile"] is False and out["dist_backend"] == "cpu:gloo,cuda:nccl"
    assert out["predicted_peak_gb"] <= out["memory_limit_gb"]


def test_v100_plans_float16_with_a_grad_scaler(capsys):
    out = doctor_json(capsys, "v100")
    assert out["device"]["compute_capability"] == [7, 0]
    assert out["actor"]["compute_dtype"] == "float16" and out["actor"]["grad_scaler"] is True
    assert out["actor"]["param_dtype"] == "float32"
    assert out["rollout"]["dtype"] == "float16"


def test_a100_plans_bfloat16(capsys):
    out = doctor_json(capsys, "a100-80gb")
    assert out["actor"]["compute_dtype"] == "bfloat16" and out["actor"]["grad_scaler"] is False
    assert out["critic"]["compute_dtype"] == "bfloat16"


def test_cpu_plans_gloo_on_the_cpu(capsys):
    out = doctor_json(capsys, "cpu")
    assert out["dist_backend"] == "gloo" and out["device_type"] == "cpu"
    assert out["actor"]["compute_dtype"] == "float32" and out["rollout"]["name"] == "hf"


def test_roles_the_config_leaves_off_are_shown_as_disabled(capsys):
    off = doctor_json(capsys, "t4")
    assert off["actor"]["enabled"] and off["critic"]["enabled"] and not off["ref"]["enabled"]
    on = doctor_json(capsys, "t4", "actor_rollout_ref.actor.use_kl_loss=true")
    assert on["ref"]["enabled"] and on["ref"]["compute_dtype"] == "float16"
    grpo = doctor_json(capsys, "t4", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4",
                       "data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=16")
    assert not grpo["critic"]["enabled"] and grpo["critic"]["compute_dtype"] == "float16"


def test_text_report_shows_device_software_plan_and_reasons(capsys):
    assert main(["--device", "p40", "--model-spec", "qwen2.5-0.5b", *QUICKSTART]) == 0
    text = capsys.readouterr().out
    assert "verl.compat plan" in text and "p40 (simulated)" in text and "sm_61" in text
    assert "flash_attn" in text and "vllm" in text and "why:" in text
    assert "actor.compute_dtype" in text


def test_model_config_is_read_from_the_model_path(tmp_path, capsys):
    config = dict(BUILTIN_MODELS["qwen2.5-0.5b"], num_hidden_layers=2)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["--json", "--device", "t4", f"actor_rollout_ref.model.path={tmp_path}",
                 f"critic.model.path={tmp_path}", *QUICKSTART]) == 0
    small = json.loads(capsys.readouterr().out)
    full = doctor_json(capsys, "t4")
    # the 2-layer model's weights, not the built-in 24-layer one's (peaks also follow the budgets each plan grows)
    weights = lambda plan: sum(v for k, v in plan["memory"]["phases"]["rollout"].items() if "weights" in k)  # noqa: E731
    assert 0 < weights(small) < weights(full)


def test_missing_model_config_is_a_clear_error(capsys):
    assert main(["--json", "--device", "t4", "actor_rollout_ref.model.path=/nonexistent/model",
                 *QUICKSTART]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "config.json" in captured.err and "--model-spec" in captured.err


def test_without_a_plannable_config_the_device_is_still_shown(capsys):
    """`python -m verl.compat` with upstream's defaults (no micro-batch sizes) cannot plan, but it still
    answers what the machine is and which kernels it has, then says what the config lacks."""
    assert main(["--device", "p40"]) == 2
    captured = capsys.readouterr()
    assert captured.out.startswith("verl.compat device") and "p40 (simulated)" in captured.out
    assert "vllm:" in captured.out and "sm_61" in captured.out
    assert "no plan for this config" in captured.err and "ppo_micro_batch_size_per_gpu" in captured.err


def test_unknown_device_and_unknown_key_are_errors(capsys):
    assert main(["--device", "p4000", "--model-spec", "qwen2.5-0.5b", *QUICKSTART]) == 2
    assert "Valid names" in capsys.readouterr().err
    assert main(["--model-spec", "qwen2.5-0.5b", "actor_rollout_ref.fsdp_config.cpu_offload=true",
                 *QUICKSTART]) == 2
    assert "cpu_offload" in capsys.readouterr().err


def test_json_stdout_is_one_object_in_a_real_subprocess():
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    env.pop("VERL_COMPAT_DEVICE", None)
    proc = subprocess.run([sys.executable, "-m", "verl.compat", "--json", "--device", "t4",
                           "--model-spec", "qwen2.5-0.5b", *QUICKSTART],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)              # the whole of stdout parses as one JSON object
    check_contract(out)
    assert out["device"]["name"] == "t4" and out["actor"]["compute_dtype"] == "float16"


def test_a_disabled_role_that_would_not_fit_reports_why(monkeypatch, capsys):
    from verl import compat

    def no_fit(*args, **kwargs):
        raise ValueError("the run does not fit")

    from verl.compat.__main__ import doctor_json, plan_for

    config, model, plan = plan_for(QUICKSTART, device="t4", model_spec="qwen2.5-0.5b")
    monkeypatch.setattr(compat, "make_plan", no_fit)   # the probe plan that switches the ref on
    out = doctor_json(config, model, plan)
    assert out["ref"] == {"enabled": False, "error": "the run does not fit"}
    assert out["actor"]["enabled"] and out["critic"]["enabled"]


def test_text_report_shows_the_memory_breakdown_json_carries_it(capsys):
    """Every phase with its total and non-zero terms, the peak phase marked, and the required total;
    the numbers are the ones --json carries under `memory`."""
    memory = doctor_json(capsys, "t4")["memory"]
    assert set(memory) >= {"phases", "peak_phase", "required_gb", "predicted_peak_gb"}
    assert main(["--device", "t4", "--model-spec", "qwen2.5-0.5b", *QUICKSTART]) == 0
    text = capsys.readouterr().out
    block = text[text.index("  memory    GiB per device"):text.index("  modes ")].splitlines()
    rows = {line.split()[0]: line for line in block[1:] if line.startswith("    ") and not line.startswith("      ")}
    assert set(rows) == set(memory["phases"]) | {"required"}
    for phase, terms in memory["phases"].items():
        total = float(rows[phase].split()[1])
        assert total == pytest.approx(sum(terms.values()), abs=0.006)
        assert rows[phase].endswith("<- peak") == (phase == memory["peak_phase"])
        shown = [t for t, gb in terms.items() if gb >= 0.0005]
        assert all(f"      {t}" in text for t in shown)
    assert f"required {memory['required_gb']:.2f} GiB" in rows["required"]
    assert f"in {memory['peak_phase']}" in rows["required"]


def test_text_report_without_a_memory_plan_has_no_memory_block():
    from verl.compat.__main__ import _text_report, plan_for

    config, model, plan = plan_for(QUICKSTART, device="t4", model_spec="qwen2.5-0.5b")
    plan.memory = {}
    assert "memory    GiB" not in _text_report(config, model, plan)


GRPO_7B = ["algorithm.adv_estimator=grpo", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=4",
           "data.max_prompt_length=256", "data.max_response_length=256", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
           "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.use_dynamic_bsz=true",
           "actor_rollout_ref.rollout.name=hf"]


def test_a_refused_7b_on_a_p40_shows_every_mode_and_names_the_lever(capsys):
    """`--device p40` plans one P40 (no trainer.n_gpus_per_node given); full training of a 7B model does
    not fit, the refusal names LoRA, and the modes block says what each mode would need."""
    assert main(["--device", "p40", "--model-spec", "qwen2.5-7b", *GRPO_7B]) == 2
    captured = capsys.readouterr()
    assert "LoRA would fit: actor_rollout_ref.model.lora_rank=32" in captured.err
    modes = captured.out[captured.out.index("  modes "):]
    rows = {line.split()[0]: line for line in modes.splitlines()[1:] if line.startswith("    ") and line.split()}
    assert "does not fit" in rows["full"] and "fits: peak" in rows["LoRA"] and "fits: peak" in rows["QLoRA"]


def test_a_config_error_still_shows_the_modes_for_the_config_as_composed(capsys):
    assert main(["--device", "p40", "--model-spec", "qwen2.5-7b"]) == 2
    captured = capsys.readouterr()
    assert "ppo_micro_batch_size_per_gpu" in captured.err and "  modes " in captured.out


def test_largest_prints_the_docs_table(capsys):
    assert main(["--largest", "--device", "p40", *GRPO_7B, "trainer.n_gpus_per_node=1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| device | full | full + offload | LoRA | QLoRA |"
    assert "| p40 | qwen2.5-0.5b | qwen2.5-3b | qwen2.5-7b | qwen2.5-7b |" in lines


def test_a_disabled_role_the_host_cannot_hold_is_reported_not_fatal(monkeypatch, capsys):
    """7B LoRA GRPO on a 24 GB card: the actor fits on the device; the critic the doctor switches on to
    show would be a full 7B offloaded to a 32 GiB host, which the real planner refuses. The doctor still
    answers (matrix.py reads it for every cell), with the refusal in the critic's place."""
    from verl.compat.device import detect

    monkeypatch.setattr(detect, "host_memory_gb", lambda: (32.0, 30.0))
    out = doctor_json(capsys, "rtx3090", "--model-spec", "qwen2.5-7b", "actor_rollout_ref.model.lora_rank=32",
                      "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4")
    assert out["actor"]["enabled"] and out["actor"]["lora_rank"] == 32
    assert out["critic"]["enabled"] is False and "host" in out["critic"]["error"]
    assert out["ref"] == {"enabled": False, "served_by_actor": True}   # the LoRA actor with adapters off

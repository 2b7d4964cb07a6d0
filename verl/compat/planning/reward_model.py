"""The reward model's role plan: dtype, attention, offload and micro-batch of a sequence-classification
reward model, decided with the same rules as the other roles.

Upstream 0.9.1 keeps the reward model under `reward.reward_model.*` and still reads the older
`reward_model.*` keys of earlier scripts, copying every one that is set over the new ones; `rm_setting`
reads them the same way, so the planner, the config check and the worker agree on what the user asked.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from verl.compat.planning import settings
from verl.compat.planning.decider import MemoryShortfall
from verl.compat.planning.memory import estimate_memory
from verl.compat.planning.model_spec import ModelSpec
from verl.compat.plan import Plan, RolePlan

ROLE = "reward_model"
# the key whose dtype and memory settings the role reads: upstream sizes its reward model's server there
ROLLOUT_PREFIX = "reward.reward_model.rollout"
_LEGACY = {"enable": "reward_model.enable", "model_path": "reward_model.model.path",
           "trust_remote_code": "reward_model.model.trust_remote_code"}


def rm_setting(config: Any, key: str, default: Any = None) -> Any:
    """`reward.reward_model.<key>`, with the legacy `reward_model.*` spelling winning where it is set
    (upstream's migration copies every set legacy key over the new one). `rollout.<x>` keys work too."""
    legacy = _LEGACY.get(key) or (f"reward_model.{key}" if key.startswith("rollout.") else None)
    if legacy is not None:
        value = settings.raw(config, legacy)
        if value is not None:
            return value
    value = settings.raw(config, f"reward.reward_model.{key}")
    return default if value is None else value


def rm_setting_key(config: Any, key: str) -> str:
    """The config key `rm_setting` read `key` from (for error messages)."""
    legacy = _LEGACY.get(key) or (f"reward_model.{key}" if key.startswith("rollout.") else None)
    if legacy is not None and settings.raw(config, legacy) is not None:
        return legacy
    return f"reward.reward_model.{key}"


def reward_model_enabled(config: Any) -> bool:
    return settings.flag(rm_setting(config, "enable", False)) is True


def max_length(config: Any) -> int:
    """Longest reward-model input: the server's `max_model_len`, else prompt_length + response_length."""
    limit = rm_setting(config, "rollout.max_model_len")
    if limit not in (None, "auto"):
        return int(limit)
    prompt = rm_setting(config, "rollout.prompt_length", 2048)
    return int(prompt) + int(rm_setting(config, "rollout.response_length", 2048))


def add_reward_model(decider, config: Any, plan: Plan, inputs=None, spec: ModelSpec | None = None) -> Plan:
    """The finished plan with its `reward_model` role (None when `reward_model.enable` is off); with the
    fit's inputs and the reward model's `spec`, its offload and micro-batch fitted by the memory model.

    The role is frozen and forward-only: dtype and attention follow the rules of the reference model
    (`reward.reward_model.rollout.dtype` is the user's dtype); sequences are never packed (the score
    is read at each row's last token of a padded batch); each rank holds a whole copy, as upstream's
    reward model server holds its own weights; and its weights wait in host memory between reward passes
    where upstream's server sleeps (`rollout.free_cache_engine`), except on a CPU device.
    """
    if not reward_model_enabled(config):
        return plan
    from verl.compat.planning.planner import _RoleConfig, _decide_role

    rc = _RoleConfig(ROLE, "reward.reward_model", "reward_model.model", ROLLOUT_PREFIX, trainable=False)
    compute_default, why = decider.default_dtype()
    decider.reasons["compute_dtype"] = why
    try:
        role = _decide_role(decider, config, rc, compute_default)
    finally:
        decider.reasons.pop("compute_dtype", None)
    if role.use_remove_padding:
        decider.note(f"{ROLE}.use_remove_padding", False, "the score is read at each row's last token of a padded batch")
    if decider.profile.backend == "cpu":
        offload = decider.note(f"{ROLE}.param_offload", False, "host memory already: on a CPU device weights live there")
    else:
        asked = settings.flag(rm_setting(config, "rollout.free_cache_engine", True))
        offload = decider.note(f"{ROLE}.param_offload", asked is not False,
                         f"{rm_setting_key(config, 'rollout.free_cache_engine')}={asked is not False}: the weights "
                         + ("wait in host memory between reward passes" if asked is not False
                            else "stay on the device"))
    micro = _micro_batch(decider, config, plan)
    role = replace(role, use_remove_padding=False, param_offload=offload, optimizer_offload=False,
                   gradient_checkpointing=False, fsdp=False, use_dynamic_bsz=False, fused_optimizer=False,
                   micro_batch_size_per_gpu=micro, forward_micro_batch_size_per_gpu=micro,
                   max_token_len_per_gpu=None, forward_max_token_len_per_gpu=None)
    decider.note(f"{ROLE}.fsdp", False, "forward-only: each rank scores its share with a whole copy (nothing to reduce)")
    if inputs is None or inputs.model is None or spec is None:
        decider.note(f"{ROLE}.memory", None, "no config.json of the policy or the reward model given: its memory "
                     "is not planned")
        return replace(plan, reward_model=role)
    return _fit_memory(decider, config, plan, role, inputs, spec)


def _micro_batch(decider, config: Any, plan: Plan) -> int:
    """Rows per reward-model forward: the policy's log-prob micro-batch (the same rows, scored once
    more), capped by `rollout.max_num_seqs`, upstream's limit on sequences its server runs at once."""
    source = plan.ref or plan.actor
    rows = source.forward_micro_batch_size_per_gpu or source.micro_batch_size_per_gpu
    why = "the policy's log-prob micro-batch (the same rows)"
    if rows is None:   # token budgets: as many rows of the longest length as the budget holds
        budget = source.forward_max_token_len_per_gpu or source.max_token_len_per_gpu or 0
        seq_len = int(settings.get(config, "data.max_prompt_length", 512)) + \
            int(settings.get(config, "data.max_response_length", 512))
        rows, why = max(budget // max(seq_len, 1), 1), "the policy's log-prob token budget over the longest rows"
    cap = rm_setting(config, "rollout.max_num_seqs")
    if cap not in (None, "auto") and int(cap) < rows:
        rows, why = int(cap), f"{rm_setting_key(config, 'rollout.max_num_seqs')}={cap}"
    return decider.note(f"{ROLE}.micro_batch_size_per_gpu", int(rows), why)


def _estimate(decider, inputs, plan: Plan, role: RolePlan, spec: ModelSpec, seq_len: int):
    return estimate_memory(inputs.model, inputs.workload, plan.actor, plan.rollout, plan.critic, plan.ref,
                           device_memory_gb=decider.profile.memory_gb, backend=decider.profile.backend,
                           fragmentation=inputs.margin, compiled_layers=inputs.compiled_layers,
                           ref_in_actor=inputs.ref_in_actor, reward_model=role, reward_model_spec=spec,
                           reward_seq_len=seq_len)


def _fit_memory(decider, config: Any, plan: Plan, role: RolePlan, inputs, spec: ModelSpec) -> Plan:
    """The reward model's offload and micro-batch that fit beside the fitted policy plan, fewest changes
    first: the planned offload with its micro-batch halved down to 1, then (weights planned to stay on the
    device) the weights waiting in host memory between passes, as upstream's server sleeping does. The
    estimate then holds a `reward_model` phase, and every other phase the weights kept on the device."""
    limit, seq_len = decider.profile.memory_gb, min(max_length(config), inputs.workload.seq_len)
    offloads = [role.param_offload] + ([True] if not role.param_offload and decider.profile.backend != "cpu" else [])
    found = None
    for offload in offloads:
        rows = role.micro_batch_size_per_gpu
        while found is None and rows >= 1:
            trial = replace(role, param_offload=offload, micro_batch_size_per_gpu=rows,
                            forward_micro_batch_size_per_gpu=rows)
            est = _estimate(decider, inputs, plan, trial, spec, seq_len)
            found = (trial, est) if est.required_gb <= limit else None
            rows //= 2
        if found is not None:
            break
    if found is None:
        raise MemoryShortfall(
            f"The reward model does not fit on {decider.profile.name} ({limit:.1f} GiB) beside the policy's plan: "
            f"scoring one sequence of {seq_len} tokens with its weights brought over from host memory needs "
            f"{est.required_gb:.2f} GiB (peak in {est.peak_phase}). Use a smaller reward model, shorter sequences "
            f"(data.max_prompt_length / max_response_length) or a larger device.")
    fitted, est = found
    _note_fit(decider, config, role, fitted, est, seq_len)
    return _with_estimate(plan, replace(fitted, predicted_peak_gb=round(est.phases[ROLE].total_gb, 3)), est)


def _note_fit(decider, config: Any, asked: RolePlan, fitted: RolePlan, est, seq_len: int) -> None:
    key = rm_setting_key(config, "rollout.free_cache_engine")
    if fitted.param_offload != asked.param_offload:
        decider.adapt(f"{ROLE}.param_offload", key, False, True,
                      "the reward model's weights do not fit on the device beside every other pass")
    if fitted.micro_batch_size_per_gpu != asked.micro_batch_size_per_gpu:
        decider.note(f"{ROLE}.micro_batch_size_per_gpu", fitted.micro_batch_size_per_gpu,
                     f"halved from {asked.micro_batch_size_per_gpu} until its pass fits (memory model)")
    decider.note(f"{ROLE}.memory", round(est.phases[ROLE].total_gb, 3),
                 f"its pass peaks at {est.phases[ROLE].total_gb:.2f} GiB ({fitted.micro_batch_size_per_gpu} rows of "
                 f"up to {seq_len} tokens beside the resident state); the plan needs {est.required_gb:.2f} GiB")


def _with_estimate(plan: Plan, role: RolePlan, est) -> Plan:
    """The plan with the reward model and the estimate that counts it: its breakdown, the peak, and the
    policy roles' peaks (which hold the reward model's weights where they stay on the device)."""
    peaks = {}
    for name in ("actor", "critic", "ref"):
        current = getattr(plan, name)
        phases = [p.total_gb for k, p in est.phases.items() if k.startswith(name) or (name == "critic" and k == "values")]
        if current is not None and phases:
            peaks[name] = replace(current, predicted_peak_gb=round(max(phases), 3))
    memory = est.to_dict()
    memory["phases_total"] = {k: {"total_gb": round(p.total_gb, 3)} for k, p in est.phases.items()}
    rollout = replace(plan.rollout, predicted_peak_gb=round(est.generation_peak_gb(), 3))
    return replace(plan, reward_model=role, memory=memory, rollout=rollout,
                   predicted_peak_gb=round(est.predicted_peak_gb, 3), **peaks)

"""The memory fit: the smallest change to the decided plan that makes its predicted peak fit.

A ladder walked in order: nothing offloaded -> optimizer offload -> params + optimizer offload of the
trained roles (a reference model stays on the device: it is read every step and, stored in half
precision, small) -> params + optimizer offload of every role, each with and without gradient
checkpointing (where the user left it to compat), then the micro-batches (or token budgets) halved down
to 1, then `PlanError` with the shortfall and the largest batch or response length that would fit (the
planner adds the LoRA / QLoRA setting that would, `verl.compat.planning.modes`). The built-in engine's generation
chunk and a vLLM engine's memory share are sized in the same search. A rung whose offloaded state does
not fit the host's RAM (`host_memory.py`) is passed over, so smaller micro-batches with less offload come
before a refusal; when the device had a plan but the host had none, the refusal names the host. Pure,
like the planner.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from verl.compat.planning.decider import Decider, MemoryShortfall
from verl.compat.planning.memory import (BYTES, FORWARD_PHASES, GiB, Workload, estimate_memory, fused_copy_gb,
                                generation_bytes_per_sequence, micro_batch_rows, vision_term)
from verl.compat.planning.model_spec import ModelSpec
from verl.compat.plan import Plan, RolePlan, RolloutPlan
from verl.compat.planning.settings import AUTO, first, get
from verl.compat.planning.throughput import decide_fused_optimizer
from verl.compat.planning.host_memory import PROCESS_GB, check_host_memory, host_state_gb
from verl.compat.planning.wrapping import wraps_in_fsdp

MAX_ROLLOUT_MICRO_BATCH = 1024   # past this, bigger built-in generate passes gain little and hold the device longer
# Below this many tokens a pass no longer fills a large GPU's matmuls; above it, halving a token budget
# costs less than recomputing every layer (checkpointing adds ~1/3 to an update's compute).
CHECKPOINT_FLOOR_TOKENS = 4096
# Token budgets left `auto` grow towards the whole pass (a mini-batch for updates, the rollout batch for
# forwards) while the plan still fits, up to this many tokens: past it a pass is long enough that its fixed
# host-side cost (FSDP hooks, guard checks, kernel launches per layer) is a few percent of it, and larger
# passes would only hold more memory.
GROWN_BUDGET_CAP = 65536


@dataclass
class _Batch:
    """Micro-batch knobs of the four forward/backward consumers (None: token budget instead)."""

    actor: int | None
    actor_forward: int | None
    critic: int | None
    critic_forward: int | None
    ref: int | None
    explicit: dict


def _largest_divisor(rows: int, cap: int) -> int:
    """The largest micro-batch of at most `cap` rows that splits `rows` evenly (workers require it)."""
    return max(d for d in range(1, max(min(rows, cap), 1) + 1) if rows % d == 0)


def micro_batches(config: Any, samples_per_prompt: int, ranks: int) -> _Batch:
    """The `auto` micro-batches' starting points: an update's at most 8 rows and a divisor of the rows one
    data-parallel rank trains per mini-batch (`ranks` processes over Ulysses groups: on CPU too, where
    the memory model counts one host memory), forwards twice that."""
    arr = "actor_rollout_ref"
    dp = max(ranks // max(int(get(config, f"{arr}.actor.ulysses_sequence_parallel_size", 1) or 1), 1), 1)
    mini = int(get(config, f"{arr}.actor.ppo_mini_batch_size", 256))
    critic_mini = int(get(config, "critic.ppo_mini_batch_size", mini))
    auto_train = _largest_divisor(max(mini * samples_per_prompt // dp, 1), 8)
    auto_critic = _largest_divisor(max(critic_mini * samples_per_prompt // dp, 1), 8)

    def pick(*paths, default):
        value = first(config, *paths)
        return (int(value), True) if value is not AUTO else (default, False)

    actor, actor_set = pick(f"{arr}.actor.ppo_micro_batch_size_per_gpu", default=auto_train)
    actor_fwd, actor_forward_set = pick(f"{arr}.rollout.log_prob_micro_batch_size_per_gpu", default=2 * actor)
    critic, critic_set = pick("critic.ppo_micro_batch_size_per_gpu", default=auto_critic)
    critic_fwd, critic_forward_set = pick("critic.forward_micro_batch_size_per_gpu", default=critic)
    ref, ref_set = pick(f"{arr}.ref.log_prob_micro_batch_size_per_gpu", default=actor_fwd)
    return _Batch(actor, actor_fwd, critic, critic_fwd, ref,
                  {"actor": actor_set, "actor_forward": actor_forward_set, "critic": critic_set,
                   "critic_forward": critic_forward_set, "ref": ref_set})


def apply_batches(roles: dict[str, RolePlan], batching: _Batch, dynamic: bool, budgets: dict) -> dict[str, RolePlan]:
    out = dict(roles)
    if dynamic:
        out["actor"] = replace(out["actor"], micro_batch_size_per_gpu=None, max_token_len_per_gpu=budgets["actor"],
                               forward_max_token_len_per_gpu=budgets["actor_forward"])
        if "critic" in out:
            out["critic"] = replace(out["critic"], micro_batch_size_per_gpu=None,
                                    max_token_len_per_gpu=budgets["critic"],
                                    forward_max_token_len_per_gpu=budgets["critic_forward"])
        if "ref" in out:
            out["ref"] = replace(out["ref"], micro_batch_size_per_gpu=None, max_token_len_per_gpu=budgets["ref"],
                                 forward_max_token_len_per_gpu=budgets["ref"])
        return out
    out["actor"] = replace(out["actor"], micro_batch_size_per_gpu=batching.actor, forward_micro_batch_size_per_gpu=batching.actor_forward)
    if "critic" in out:
        out["critic"] = replace(out["critic"], micro_batch_size_per_gpu=batching.critic,
                                forward_micro_batch_size_per_gpu=batching.critic_forward)
    if "ref" in out:
        out["ref"] = replace(out["ref"], micro_batch_size_per_gpu=batching.ref, forward_micro_batch_size_per_gpu=batching.ref)
    return out


def vllm_need_gb(model: ModelSpec, workload: Workload, dtype: str) -> float:
    """The least vLLM needs: its weights, KV for min(batch, 16) full sequences, 0.5 GiB of scratch."""
    seqs = min(workload.rollout_batch_per_gpu, 16)
    kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * seqs * workload.seq_len * BYTES[dtype]
    return (model.num_params * BYTES[dtype] + kv) / GiB + 0.5




def ladder(asked_off: dict, roles: dict):
    """Offload rungs in order; a role whose user set offload explicitly keeps that setting. Parameters
    stay on the device where bitsandbytes holds them (a 4-bit base runs unwrapped on one device) or
    steps them (its 8-bit AdamW has no host implementation): param offload would move both to the host."""
    def offload(level: int) -> dict[str, tuple[bool, bool]]:
        out = {}
        for name, role_plan in roles.items():
            asked_params, asked_optimizer = asked_off[name]
            trainable = name != "ref"
            want_o = level >= 1 and trainable
            want_p = (level >= 3 or (level == 2 and trainable)) and role_plan.base_quantization is None \
                and not role_plan.optimizer_8bit
            out[name] = (asked_params if asked_params is not AUTO else want_p,
                         (asked_optimizer if asked_optimizer is not AUTO else want_o) and trainable)
        return out
    rungs = [("nothing offloaded", offload(0)), ("optimizer offload", offload(1)),
             ("params + optimizer offload, reference kept", offload(2)), ("params + optimizer offload", offload(3))]
    # without a reference model the last two rungs are one
    return rungs if "ref" in roles else rungs[:2] + rungs[3:]


def chunk_size(fits: int, batch: int, asked: Any, whole: bool) -> int | None:
    """Sequences per built-in generate pass, given how many fit at once (None: too few fit).

    The user's size when it fits; else the largest power of two that fits (at most
    MAX_ROLLOUT_MICRO_BATCH), raised to the training batch when that fits whole so a training
    rollout runs in one pass. `whole` asks for the training batch (or the user's size) to fit
    in one pass, which the fit tries before settling for chunked training rollouts.
    """
    fits = min(fits, MAX_ROLLOUT_MICRO_BATCH)
    target = min(batch, MAX_ROLLOUT_MICRO_BATCH) if asked is AUTO else min(batch, asked)
    if fits < (target if whole else 1):
        return None
    if asked is not AUTO and asked <= fits:
        return asked
    return max(1 << (fits.bit_length() - 1), min(batch, fits))


@dataclass
class FitInputs:
    """What the memory fit weighs: the model and workload, the decided role plans and rollout, and
    the user's memory-related settings (AUTO where the fit may choose)."""

    model: ModelSpec
    workload: Workload
    roles: dict
    rollout: RolloutPlan
    rollout_asked: dict
    batches: _Batch
    dynamic: bool
    budgets: dict
    asked_ckpt: dict
    asked_off: dict
    margin: float
    asked_reshard: dict   # role -> (config key, True | False | AUTO): fsdp reshard_after_forward
    compiled_layers: bool = False   # the plan's torch_compile (compiled layers keep less for backward)
    growable: frozenset = frozenset()   # budget names ("actor", "actor_forward", ...) the user left `auto`
    ranks: int = 1                  # data-parallel processes (the workload's world is 1 on a CPU host)
    always_fsdp: bool = False       # compat.always_fsdp (verl.compat.planning.wrapping)
    ref_in_actor: bool = False      # the LoRA actor computes the reference log-probs (no reference model)
    nnodes: int = 1                 # trainer.nnodes (offloaded shards spread over the nodes' host memory)
    fuse_decode: bool = False       # the built-in engine may fuse its decode projections, room permitting


def settled(decider: Decider, inputs: FitInputs, name: str, role_plan: RolePlan) -> RolePlan:
    """`role_plan` with what follows from the offload the fit chose, which the memory counts: its FSDP2 wrapping
    and its optimizer's kernel (the planner notes both reasons once the plan is final)."""
    fused = name != "ref" and decide_fused_optimizer(lambda _key, value, _why: value, decider.profile, name,
                                                     role_plan.param_offload, decider.software.torch_version, role_plan.optimizer_8bit)
    return replace(role_plan, fsdp=wraps_in_fsdp(role_plan, inputs.ranks, inputs.always_fsdp)[0], fused_optimizer=fused)


def _estimate(decider: Decider, inputs: FitInputs, roles: dict, rollout: RolloutPlan):
    return estimate_memory(inputs.model, inputs.workload, roles["actor"], rollout, roles.get("critic"), roles.get("ref"),
                           device_memory_gb=decider.profile.memory_gb, backend=decider.profile.backend, fragmentation=inputs.margin,
                           compiled_layers=inputs.compiled_layers, ref_in_actor=inputs.ref_in_actor)


def _host_layout(decider: Decider, inputs: FitInputs) -> tuple[int, int, bool]:
    """(nodes, ranks per node, whether offloaded state is page-locked: on an accelerator, not on CPU)."""
    nodes = max(inputs.nnodes, 1)
    return nodes, max(inputs.ranks // nodes, 1), decider.profile.backend != "cpu"


class _Search:
    """The fit's search: offload rungs x checkpointing x micro-batch halvings, smallest change first."""

    def __init__(self, decider: Decider, inputs: FitInputs):
        self.decider, self.inputs = decider, inputs
        self.limit = decider.profile.memory_gb
        self.util_asked = inputs.rollout_asked["gpu_memory_utilization"]
        self.micro_asked = inputs.rollout_asked["micro_batch_size"]
        self.per_seq = generation_bytes_per_sequence(inputs.model, inputs.roles["actor"], inputs.rollout,
                                                     inputs.workload.prompt_length, inputs.workload.response_length,
                                                     inputs.workload.image_tokens) / GiB
        asked, roles = inputs.asked_ckpt, inputs.roles
        self.host_refusal: str | None = None   # why the first rung that fitted the device did not fit the host
        self.ckpt_options = [{n: (asked[n] if asked[n] is not AUTO else False) for n in roles}]
        if any(asked[n] is AUTO for n in roles):
            self.ckpt_options.append({n: (asked[n] if asked[n] is not AUTO else True) for n in roles})

    def build(self, offload, ckpt_on, batching, budgets_now, util, chunk=None):
        inputs = self.inputs
        role_plans = apply_batches(inputs.roles, batching, inputs.dynamic, budgets_now)
        for name in role_plans:
            role_plans[name] = settled(self.decider, inputs, name, replace(
                role_plans[name], gradient_checkpointing=ckpt_on[name], param_offload=offload[name][0],
                optimizer_offload=offload[name][1]))
        rollout_plan = replace(inputs.rollout, gpu_memory_utilization=util, micro_batch_size=chunk)
        return role_plans, rollout_plan, _estimate(self.decider, inputs, role_plans, rollout_plan)

    def hf_chunk(self, offload, ckpt_on, batching, budgets_now, whole: bool) -> int | None:
        """The built-in engine's chunk: as many sequences as the memory free while generating holds."""
        estimate = self.build(offload, ckpt_on, batching, budgets_now, 0.0, chunk=1)[2]
        free = estimate.room_gb(self.limit) - estimate.rollout_resident_gb()
        return chunk_size(max(int(free // self.per_seq), 0), self.inputs.workload.rollout_batch_per_gpu,
                          self.micro_asked, whole)

    def vllm_util(self, offload, ckpt_on, batching, budgets_now) -> tuple[float | None, str]:
        """The vLLM share: user's if it fits, else what the other phases leave (None: too little)."""
        estimate = self.build(offload, ckpt_on, batching, budgets_now, 0.0)[2]
        free = estimate.room_gb(self.limit) - estimate.rollout_resident_gb()
        left = math.floor(100 * free / self.limit) / 100
        need = vllm_need_gb(self.inputs.model, self.inputs.workload, self.inputs.rollout.dtype) / self.limit
        if self.util_asked is not AUTO:
            share = float(self.util_asked)
            if share <= left:
                return share, "set by the user; fits next to the resident training state"
            if left >= need:
                return self.decider.adapt("rollout.gpu_memory_utilization",
                                    "actor_rollout_ref.rollout.gpu_memory_utilization", share, min(left, 0.9),
                                    "that share does not fit next to the training state"), ""
            return None, ""
        if left < need:
            return None, ""
        if self.decider.profile.backend == "cpu":  # host memory is shared with everything else: take only what it needs
            return math.ceil(100 * need) / 100, ("vLLM's CPU build: its weights, KV cache for min(batch, 16) "
                                                 "sequences and scratch, as a share of host memory")
        return min(left, 0.9), "share of device memory left after the resident training state (memory model)"

    def attempt(self, batching: _Batch, budgets_now: dict, whole: bool, rungs: int | None = None, ckpt: int | None = None):
        vllm = self.inputs.rollout.name == "vllm"
        generates = self.inputs.workload.generates
        for rung, offload in ladder(self.inputs.asked_off, self.inputs.roles)[:rungs]:
            for ckpt_on in self.ckpt_options[:ckpt]:
                util, why, chunk = 0.0, "", None
                if not generates:
                    pass   # no engine to size: the update and the forwards are the step
                elif vllm:
                    util, why = self.vllm_util(offload, ckpt_on, batching, budgets_now)
                    if util is None:
                        continue
                else:
                    chunk = self.hf_chunk(offload, ckpt_on, batching, budgets_now, whole)
                    if chunk is None:
                        continue
                role_plans, rollout_plan, estimate = self.build(offload, ckpt_on, batching, budgets_now, util, chunk)
                if generates and not vllm:
                    engine = sum(v for k, v in estimate.phases["rollout"].terms.items() if k.startswith("rollout."))
                    util = round(min(engine / self.limit, 1.0), 3)
                    why = "built-in engine allocates on demand; predicted share of its weights, KV cache and logits"
                    rollout_plan = replace(rollout_plan, gpu_memory_utilization=util)
                if estimate.required_gb <= self.limit:
                    refusal = self.host_shortfall(role_plans)
                    if refusal is None:
                        return rung, ckpt_on, role_plans, rollout_plan, estimate, why
                    self.host_refusal = self.host_refusal or refusal
        return None

    def host_shortfall(self, role_plans: dict) -> str | None:
        """Why these roles' offloaded state does not fit the host's RAM (None: it fits). A rung that offloads
        more than the host holds is passed over, so smaller micro-batches with less offload are tried instead."""
        nodes, ranks_per_node, pinned = _host_layout(self.decider, self.inputs)
        try:
            check_host_memory(self.decider.profile.host_memory_gb, self.inputs.model, role_plans, ranks_per_node, nodes,
                              pinned=pinned)
        except MemoryShortfall as err:
            return str(err)
        return None

    def _without_recompute(self, whole: bool):
        """Nothing offloaded, checkpointing off where compat decides it, budgets halved to the floor."""
        inputs = self.inputs
        batching, budgets, halvings = inputs.batches, dict(inputs.budgets), 0
        floor = max(CHECKPOINT_FLOOR_TOKENS, inputs.workload.seq_len)
        while (found := self.attempt(batching, budgets, whole, rungs=1, ckpt=1)) is None:
            if min(budgets.values()) // 2 < floor:
                return None
            batching, budgets = halve(batching, budgets, inputs.dynamic, inputs.workload.seq_len)
            halvings += 1
        return found, batching, budgets, halvings

    def search(self, whole: bool):
        """Walk the ladder, halving micro-batches until a rung fits; None at the floor."""
        inputs = self.inputs
        if inputs.dynamic:
            # Token budgets are a speed device: shrink them before recomputing activations (down to
            # CHECKPOINT_FLOOR_TOKENS a pass), and before offloading anything (to one sequence a pass),
            # whose host round trips every step cost more than smaller passes.
            found = self._without_recompute(whole)
            if found is not None:
                return found
            batching, budgets, halvings = inputs.batches, dict(inputs.budgets), 0
            while (found := self.attempt(batching, budgets, whole, rungs=1)) is None:
                smaller = halve(batching, budgets, inputs.dynamic, inputs.workload.seq_len)
                if smaller is None:
                    break
                batching, budgets = smaller
                halvings += 1
            if found is not None:
                return found, batching, budgets, halvings
        batching, budgets, halvings = inputs.batches, dict(inputs.budgets), 0
        while (found := self.attempt(batching, budgets, whole)) is None:
            smaller = halve(batching, budgets, inputs.dynamic, inputs.workload.seq_len)
            if smaller is None:
                return None, batching, budgets, halvings
            batching, budgets = smaller
            halvings += 1
        return found, batching, budgets, halvings


def fit(decider: Decider, inputs: FitInputs, plan_kwargs: dict) -> Plan:
    """The plan whose predicted peak fits the device, found by the smallest change that fits."""
    search = _Search(decider, inputs)
    # First keep each training rollout in one pass (offloading for it, as before chunking existed);
    # the built-in engine may then settle for chunked training rollouts.
    found, batching, budgets, halvings = search.search(whole=True)
    if found is None and inputs.rollout.name == "hf" and inputs.workload.generates:
        found, batching, budgets, halvings = search.search(whole=False)
    if found is None:
        if search.host_refusal is not None:   # the device had a plan; the host's RAM had none
            raise MemoryShortfall(search.host_refusal)
        raise_shortfall(decider, inputs, batching, budgets, search.limit)
    return _fitted_plan(decider, inputs, search, found, batching, halvings, plan_kwargs)


def decide_fused_decode(decider: Decider, inputs: FitInputs, roles: dict, rollout: RolloutPlan, estimate,
                        limit: float):
    """The fitted plan with the built-in engine's fused decode copies (`rollout.fused_projections`) where the
    planner found them worth it (`inputs.fuse_decode`) and the plan, copies counted, still fits: decided after
    the fit, so the copies only take memory the plan leaves free."""
    if not inputs.fuse_decode:
        return rollout, estimate
    trial = replace(rollout, fused_projections=True)
    fused = _estimate(decider, inputs, roles, trial)
    copy_gb = fused_copy_gb(inputs.model, rollout.dtype)
    if fused.required_gb <= limit:
        decider.note("rollout.fused_projections", True,
                     f"decode step reads q/k/v and gate/up as one matmul each from {copy_gb:.2f} GiB of copies made per "
                     "rollout: three fewer kernels per layer in a launch-bound step")
        return trial, fused
    decider.note("rollout.fused_projections", False,
                 f"no room for its {copy_gb:.2f} GiB of copies in the fitted plan ({fused.required_gb:.2f} of {limit:.1f} GiB)")
    return rollout, estimate


def _note_roles(decider: Decider, inputs: FitInputs, roles: dict, rung: str, halvings: int) -> None:
    for name, role_plan in roles.items():
        decider.note(f"{name}.fsdp", role_plan.fsdp, wraps_in_fsdp(role_plan, inputs.ranks, inputs.always_fsdp)[1])
        asked_ckpt = inputs.asked_ckpt[name]
        decider.note(f"{name}.gradient_checkpointing", role_plan.gradient_checkpointing,
               "set by the user" if asked_ckpt is not AUTO else
               ("activations do not fit without it" if role_plan.gradient_checkpointing
                else "activations fit without it"))
        asked_params, asked_optimizer = inputs.asked_off[name]
        if decider.profile.backend != "cpu":   # on CPU the planner gave the offload reasons (host memory already)
            decider.note(f"{name}.param_offload", role_plan.param_offload,
                   "set by the user" if asked_params is not AUTO else f"memory plan: {rung}")
            decider.note(f"{name}.optimizer_offload", role_plan.optimizer_offload,
                   "set by the user" if asked_optimizer is not AUTO else
                   (f"memory plan: {rung}" if name != "ref" else "a frozen model has no optimizer"))
        key = "max_token_len_per_gpu" if inputs.dynamic else "micro_batch_size_per_gpu"
        decider.note(f"{name}.{key}", getattr(role_plan, key),
               f"halved {halvings}x to fit (mini-batch unchanged, so the update's math is unchanged)"
               if halvings else "as configured")


def _fitted_plan(decider: Decider, inputs: FitInputs, search: _Search, found, batching: _Batch, halvings: int,
                 plan_kwargs: dict) -> Plan:
    rung, _, role_plans, rollout_plan, estimate, util_why = found
    limit = search.limit
    _note_roles(decider, inputs, role_plans, rung, halvings)
    role_plans, estimate = decide_reshard(decider, inputs, role_plans, rollout_plan, estimate)
    role_plans, estimate = decide_forward_gather(decider, inputs, role_plans, rollout_plan, estimate)
    role_plans, estimate = grow_budgets(decider, inputs, role_plans, rollout_plan, estimate)
    rollout_plan, estimate = decide_fused_decode(decider, inputs, role_plans, rollout_plan, estimate, limit)
    if halvings:
        for name, explicit in batching.explicit.items():
            if explicit:
                decider.warnings.append(f"{name} micro-batch reduced to fit {decider.profile.name} ({halvings} halvings); "
                                  f"gradient accumulation keeps the mini-batch and the math unchanged.")
                break
    if inputs.workload.generates:
        decider.note("rollout.gpu_memory_utilization", rollout_plan.gpu_memory_utilization, util_why)
    if rollout_plan.name == "hf" and inputs.workload.generates:
        note_chunk(decider, rollout_plan.micro_batch_size, search.micro_asked, estimate, limit, search.per_seq,
                   inputs.workload)
    for name, rp in role_plans.items():
        phases = [p for k, p in estimate.phases.items() if k.startswith(name) or (name == "critic" and k == "values")]
        role_plans[name] = replace(rp, predicted_peak_gb=round(max(p.total_gb for p in phases), 3))
    rollout_plan = replace(rollout_plan, predicted_peak_gb=round(estimate.generation_peak_gb(), 3))
    note_vision(decider, inputs, role_plans, estimate, halvings)
    decider.note("memory", round(estimate.predicted_peak_gb, 3),
           f"peak {estimate.predicted_peak_gb:.2f} GiB in {estimate.peak_phase}; with context and {inputs.margin:.0%} margin "
           f"{estimate.required_gb:.2f} of {limit:.1f} GiB ({rung})")
    memory = estimate.to_dict()
    memory["phases_total"] = {k: {"total_gb": round(p.total_gb, 3)} for k, p in estimate.phases.items()}
    nodes, ranks_per_node, pinned = _host_layout(decider, inputs)
    host = host_state_gb(inputs.model, role_plans, nodes, ranks_per_node, pinned=pinned)
    if host:   # one worker process's offloaded state and its own memory: what `perf/cpu_memory_used_gb` measures
        memory["host_gb_per_worker"] = round(host / ranks_per_node + PROCESS_GB, 3)
    plan_kwargs.update(actor=role_plans["actor"], critic=role_plans.get("critic"), ref=role_plans.get("ref"),
                       rollout=rollout_plan, predicted_peak_gb=round(estimate.predicted_peak_gb, 3))
    return Plan(reasons=decider.reasons, warnings=decider.warnings, memory=memory, **plan_kwargs)


def note_vision(decider: Decider, inputs: FitInputs, roles: dict, estimate, halvings: int) -> None:
    """A VL model's tower activations in the fitted plan: what its micro-batches hold, and what the fit
    changed for them (checkpointing, which covers the tower's blocks, and micro-batch halvings)."""
    model, wl, actor = inputs.model, inputs.workload, roles["actor"]
    if model.vision is None or not wl.image_tokens:
        return
    rows, fwd_rows = (micro_batch_rows(actor, wl, "actor", forward) for forward in (False, True))
    update = vision_term(model, wl, actor, True, rows, train=True) / GiB
    forward = vision_term(model, wl, actor, True, fwd_rows, train=False) / GiB
    kept = ("frozen: only its pixels" if actor.vision_frozen else
            "checkpointed: its blocks' inputs" if actor.gradient_checkpointing else "every block's saved tensors")
    fitted = []
    if actor.gradient_checkpointing and inputs.asked_ckpt["actor"] is AUTO:
        fitted.append("gradient checkpointing turned on to fit (the tower's blocks with the decoder's)")
    if halvings:
        fitted.append(f"micro-batches halved {halvings}x to fit")
    peak = estimate.phases["actor_update"].total_gb
    decider.note("vision.activations", round(update, 3),
                 f"{update:.3f} GiB of vision tower in an actor update micro-batch of {rows} sequences "
                 f"({kept}; pixels included) of its {peak:.2f} GiB peak, {forward:.3f} GiB at once in a log-prob "
                 f"micro-batch of {fwd_rows}, for {wl.image_tokens} image tokens a sequence (data.max_prompt_length)"
                 + ("; " + ", ".join(fitted) if fitted else ""))


# At world size > 1 the kept gathered model is every rank's shard and the multi-rank gather buffers are
# modelled, not measured on a GPU: compat keeps it only with this share of the device left unused.
MULTI_RANK_RESHARD_HEADROOM = 0.25


UNWRAPPED = "the model runs unwrapped (see fsdp): nothing is gathered"


def decide_reshard(decider: Decider, inputs: FitInputs, roles: dict, rollout: RolloutPlan, estimate):
    """FSDP2's `reshard_after_forward` per role, on top of the fitted plan; returns (roles, estimate).

    False keeps each layer's gathered weights from its forward to its backward in an update, so
    backward skips a second all-gather per layer and micro-batch (on one device that gather is a
    copy and cast of the local weights, pure overhead), at the cost of a whole model gathered at the
    end of forward. It is the cheapest speed-up to give up, so the fit plans upstream's True and this
    keeps False only where the memory model says it still fits: always tried at world size 1, at more
    ranks only when the role's update (the only phase it changes; generation sizes itself to fill the
    device) leaves MULTI_RANK_RESHARD_HEADROOM of the device free. An explicit value is kept; an
    explicit False that does not fit is adapted (a warning, or PlanError under compat.strict).
    """
    limit, world_size = decider.profile.memory_gb, inputs.workload.world_size
    for name in list(roles):
        key, asked = inputs.asked_reshard[name]
        if not roles[name].fsdp:
            decider.note(f"{name}.reshard_after_forward", roles[name].reshard_after_forward, UNWRAPPED)
            continue
        skip = _keeps_resharding(name, roles[name])
        if name == "ref" and asked is False:   # honoured; its forwards have no gradients and reshard anyway
            roles = dict(roles, ref=replace(roles["ref"], reshard_after_forward=False))
        if asked is True or name == "ref" or (asked is AUTO and skip):
            user = "set by the user" + (f" ({skip})" if name == "ref" else "")
            decider.note(f"{name}.reshard_after_forward", asked is not False, skip if asked is AUTO else user)
            continue
        trial = dict(roles, **{name: replace(roles[name], reshard_after_forward=False)})
        trial_est = _estimate(decider, inputs, trial, rollout)
        update = trial_est.phases[f"{name}_update"].total_gb * (1 + inputs.margin) + trial_est.context_gb
        need = f"the {name} update needs {update:.2f} of {limit:.1f} GiB with every layer kept gathered"
        fits = trial_est.required_gb <= limit
        if fits and (world_size == 1 or asked is False or update <= limit * (1 - MULTI_RANK_RESHARD_HEADROOM)):
            roles, estimate = trial, trial_est
            decider.note(f"{name}.reshard_after_forward", False,
                   f"set by the user; {need}" if asked is False else _why_kept(world_size, need))
        elif asked is False:
            decider.adapt(f"{name}.reshard_after_forward", key, False, True, need)
        else:
            decider.note(f"{name}.reshard_after_forward", True, f"upstream's default: {need}" + (
                "" if not fits else f", less than {MULTI_RANK_RESHARD_HEADROOM:.0%} of the device to spare"))
    return roles, estimate


def decide_forward_gather(decider: Decider, inputs: FitInputs, roles: dict, rollout: RolloutPlan, estimate):
    """Whether each role's forward-only passes (old and reference log-probs, values) gather the whole
    model once per call; returns (roles, estimate). Otherwise FSDP2 gathers (copies, casts) every
    layer again for every micro-batch, a per-parameter host cost that can leave the device idle for most
    of the pass (docs/compat.md). The whole model in the gather dtype must fit beside the pass's activations:
    always tried at world size 1, at more ranks only with MULTI_RANK_RESHARD_HEADROOM to spare."""
    limit, world_size = decider.profile.memory_gb, inputs.workload.world_size
    for name in list(roles):
        phase = FORWARD_PHASES[name]
        if not roles[name].fsdp:
            decider.note(f"{name}.gather_for_forward", False, UNWRAPPED)
            continue
        if roles[name].param_offload or phase not in estimate.phases:
            decider.note(f"{name}.gather_for_forward", False, "parameters offloaded to the host: gathered per layer"
                   if roles[name].param_offload else f"no {phase} pass in this run")
            continue
        trial = dict(roles, **{name: replace(roles[name], gather_for_forward=True)})
        trial_est = _estimate(decider, inputs, trial, rollout)
        need = trial_est.phases[phase].total_gb * (1 + inputs.margin) + trial_est.context_gb
        why = f"the {phase} pass needs {need:.2f} of {limit:.1f} GiB with the whole model gathered"
        if trial_est.required_gb <= limit and (world_size == 1 or need <= limit * (1 - MULTI_RANK_RESHARD_HEADROOM)):
            roles, estimate = trial, trial_est
            decider.note(f"{name}.gather_for_forward", True, f"one gather per call, not per layer and micro-batch ({why})")
        else:
            decider.note(f"{name}.gather_for_forward", False, f"each layer gathered per micro-batch: {why}"
                   + ("" if trial_est.required_gb > limit else f", less than {MULTI_RANK_RESHARD_HEADROOM:.0%} spare"))
    return roles, estimate


# Each token budget: (role, RolePlan fields it sets, whether its pass is forward-only).
_BUDGET_FIELDS = {
    "actor": ("actor", ("max_token_len_per_gpu",), False),
    "actor_forward": ("actor", ("forward_max_token_len_per_gpu",), True),
    "critic": ("critic", ("max_token_len_per_gpu",), False),
    "critic_forward": ("critic", ("forward_max_token_len_per_gpu",), True),
    "ref": ("ref", ("max_token_len_per_gpu", "forward_max_token_len_per_gpu"), True),
}


def grow_budgets(decider: Decider, inputs: FitInputs, roles: dict, rollout: RolloutPlan, estimate):
    """Double each `auto` token budget while the finished plan still fits, towards its whole pass
    (capped at GROWN_BUDGET_CAP tokens); returns (roles, estimate).

    Every micro-batch pays the same host-side cost whatever its size (FSDP2's per-layer hooks and
    gradient reduction, compiled-graph guards, one launch per kernel), so small passes leave the device
    idle (docs/compat.md, "Memory model", has the profile). Fewer, fuller passes change no math (losses are normalised by the global mini-batch). This runs last, so it only spends memory
    that no offload, checkpointing or resharding decision wanted.
    """
    if not inputs.dynamic:
        return roles, estimate
    limit, wl = decider.profile.memory_gb, inputs.workload
    # at several ranks the memory model's gather buffers are modelled, not measured: keep the same share free
    # as the resharding decision does
    room = limit if wl.world_size == 1 else limit * (1 - MULTI_RANK_RESHARD_HEADROOM)
    for key, (name, fields, forward) in _BUDGET_FIELDS.items():
        if name not in roles:
            continue
        start = getattr(roles[name], fields[0])
        whole = min(wl.sequences_seen(name, forward) * wl.seq_len, GROWN_BUDGET_CAP)
        if key not in inputs.growable:
            # a configured budget the fit halved grows back towards its setting where the role's parameters
            # are offloaded: every pass streams all of them host -> device, so fewer passes move less
            if not roles[name].param_offload or start is None or start >= (inputs.budgets.get(key) or 0):
                continue
            whole = min(whole, inputs.budgets[key])
        budget = start
        while budget < whole:
            bigger = min(2 * budget, whole)
            trial = dict(roles, **{name: replace(roles[name], **{f: bigger for f in fields})})
            trial_est = _estimate(decider, inputs, trial, rollout)
            if trial_est.required_gb > room:
                break
            roles, estimate, budget = trial, trial_est, bigger
        if budget > start and roles[name].param_offload:
            decider.note(f"{name}.{fields[0]}", budget,
                         f"{budget // wl.seq_len} full-length sequences a pass, the most that fit: parameters are "
                         f"offloaded, so each pass streams every weight host -> device; the plan needs "
                         f"{estimate.required_gb:.2f} of {limit:.1f} GiB")
        elif budget > start:
            if budget >= wl.sequences_seen(name, forward) * wl.seq_len:
                what = "the whole pass"
            elif budget == GROWN_BUDGET_CAP:
                what = f"at most {GROWN_BUDGET_CAP} tokens a pass"
            else:
                what = "as far as memory allows"
            decider.note(f"{name}.{fields[0]}", budget,
                         f"grown from {start} ({what}): fewer, fuller passes pay the per-pass host cost less often; "
                         f"the plan still needs {estimate.required_gb:.2f} of {limit:.1f} GiB")
    return roles, estimate


def _keeps_resharding(name: str, role_plan: RolePlan) -> str:
    """Why a role reshards after forward whatever the memory (empty when the memory decides)."""
    if name == "ref":
        return "a frozen model runs no backward: nothing to keep its gathered weights for"
    if role_plan.param_offload:
        return "parameters offloaded to the host (memory is short): gathered weights are freed after each forward"
    return ""


def _why_kept(world_size: int, need: str) -> str:
    if world_size == 1:
        return (f"one device: FSDP2's gather is a copy (and cast) of local weights, so each layer keeps them from "
                f"forward to backward ({need})")
    return f"memory is plentiful at {world_size} ranks ({need}): backward skips one all-gather per layer"


def note_chunk(decider: Decider, chunk: int, asked: Any, estimate, limit: float, per_seq: float, workload: Workload) -> None:
    """Reason (or adaptation warning) for the built-in engine's chunk size."""
    free = estimate.room_gb(limit) - estimate.rollout_resident_gb()
    full = estimate.rollout_resident_gb() + chunk * per_seq
    vision = ", the vision tower's forward over its images" if workload.image_tokens else ""
    sizing = (f"{free:.2f} GiB free while generating / {per_seq * 1024:.1f} MiB per sequence of {workload.seq_len} "
              f"tokens (KV cache, prefill transients, sampling{vision}); a full pass peaks at {full:.2f} GiB")
    if asked is AUTO:
        decider.note("rollout.micro_batch_size", chunk, f"{chunk} sequences per pass: {sizing}")
    elif asked == chunk:
        decider.note("rollout.micro_batch_size", chunk, f"set by the user; {sizing}")
    else:
        decider.adapt("rollout.micro_batch_size", "actor_rollout_ref.rollout.micro_batch_size", asked, chunk,
                f"{asked} sequences need {asked * per_seq:.2f} GiB while generating, {free:.2f} GiB are free")


def halve(batching: _Batch, budgets: dict, dynamic: bool, seq_len: int):
    """Next rung of the micro-batch ladder, or None when everything is already at its floor."""
    if dynamic:
        if all(v <= seq_len for v in budgets.values()):
            return None
        return batching, {k: max(v // 2, seq_len) for k, v in budgets.items()}
    sizes = [batching.actor, batching.actor_forward, batching.critic, batching.critic_forward, batching.ref]
    if all(s <= 1 for s in sizes):
        return None
    # an update's micro-batch stays a divisor of the one before (so of the rank's mini-batch): 6 -> 3 -> 1
    h = [_largest_divisor(s, max(s // 2, 1)) if i in (0, 2) else max(s // 2, 1) for i, s in enumerate(sizes)]
    return _Batch(*h, explicit=batching.explicit), budgets


def raise_shortfall(decider: Decider, inputs: FitInputs, batching: _Batch, budgets: dict, limit: float) -> None:
    """Nothing fits: say by how much, and the largest batch / length that would."""
    model, workload, roles, rollout = inputs.model, inputs.workload, inputs.roles, inputs.rollout
    dynamic, margin = inputs.dynamic, inputs.margin
    ck = {n: True for n in roles}

    def at_rung(workload: Workload, offload: dict):
        rs = apply_batches(roles, batching, dynamic, budgets)
        for name in rs:
            rs[name] = settled(decider, inputs, name, replace(rs[name], gradient_checkpointing=ck[name],
                                                     param_offload=offload[name][0], optimizer_offload=offload[name][1]))
        ro = replace(rollout, gpu_memory_utilization=0.0, micro_batch_size=1)   # the engine can chunk to 1
        if rollout.name == "vllm":
            ro = replace(ro, gpu_memory_utilization=vllm_need_gb(model, workload, rollout.dtype) / limit)
        return estimate_memory(model, workload, rs["actor"], ro, rs.get("critic"), rs.get("ref"),
                               device_memory_gb=limit, backend=decider.profile.backend, fragmentation=margin,
                               compiled_layers=inputs.compiled_layers, ref_in_actor=inputs.ref_in_actor)

    def required(workload: Workload):
        """The smallest rung's estimate (param offload is not always smaller: an offloaded model is gathered
        whole for generation, which a LoRA model stored in half precision or 4 bits reads in place)."""
        return min((at_rung(workload, offload) for _, offload in ladder(inputs.asked_off, roles)), key=lambda e: e.required_gb)

    est = required(workload)
    need = est.required_gb
    hint = ""
    batch = workload.rollout_batch_per_gpu
    while batch > 1:
        batch //= 2
        if required(replace(workload, rollout_batch_per_gpu=batch)).required_gb <= limit:
            hint = f" The largest setting that fits: data.train_batch_size <= {batch * workload.world_size} per step."
            break
    if not hint:
        resp = workload.response_length
        while resp > 16:
            resp //= 2
            wl = replace(workload, rollout_batch_per_gpu=1, response_length=resp)
            if required(wl).required_gb <= limit:
                hint = (f" The largest setting that fits: data.train_batch_size=1 with "
                        f"data.max_response_length <= {resp}.")
                break
    if not hint:
        hint = f" Use a device with at least {math.ceil(need)} GiB, or a smaller model."
    raise MemoryShortfall(
        f"The run does not fit on {decider.profile.name} ({limit:.1f} GiB): even at the smallest plan (the offload "
        f"the settings allow, gradient checkpointing, micro-batch 1) it needs {need:.2f} GiB (peak in {est.peak_phase}), "
        f"{need - limit:.2f} GiB more than the device has.{hint}")

"""Memory model vs measurement: peak allocated memory per PPO phase, predicted and measured.

Builds a Qwen2.5-0.5B-shaped model with random weights (no download), plans it for simulated
devices with `verl.compat.planner.make_plan`, then runs each phase for real on one device in
the plan's dtypes: generation with a KV cache in the plan's rollout chunks, no-grad log-probs /
values, and actor / critic fwd+bwd+AdamW steps (autocast and gradient checkpointing as planned), with every role's
persistent state (weights, optimizer) resident or offloaded to the host as the plan says.
Measurement: `torch.cuda.max_memory_allocated` per phase on CUDA; on CPU (tests) the bytes of
every tensor storage created while a phase runs, plus the bytes resident at its start.

    python benchmarks/memory_model.py --out memory.json [--devices p40,t4,a100-40gb,h200]
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verl.compat.catalog import get_profile
from verl.compat.memory import GiB
from verl.compat.model_spec import BUILTIN_MODELS, ModelSpec
from verl.compat.planner import make_plan
from verl.compat.profile import SoftwareInfo
from verl.utils.torch_functional import logprobs_from_logits


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)

QWEN25_05B = {k: v for k, v in BUILTIN_MODELS["qwen2.5-0.5b"].items() if k != "model_type"}

SETTINGS = {
    # the field report: batch 1, micro-batch 1, 256 + 256 tokens
    "field_report": {"train_batch_size": 1, "ppo_mini_batch_size": 1, "micro": 1, "log_prob_micro": 1,
                         "prompt": 256, "response": 256},
    # upstream's quick start: batch 256, mini 64, micro 4 (log-prob micro 8 / ref 4), 512 + 512
    "quickstart": {"train_batch_size": 256, "ppo_mini_batch_size": 64, "micro": 4, "log_prob_micro": 8,
                       "ref_micro": 4, "prompt": 512, "response": 512},
}


def make_config(setting: dict, model_path: str = "") -> dict:
    """A config dict with upstream's key names (hardware keys left to the planner)."""
    s = setting
    return {
        "data": {"train_batch_size": s["train_batch_size"], "max_prompt_length": s["prompt"],
                 "max_response_length": s["response"]},
        "actor_rollout_ref": {
            "model": {"path": model_path},
            "actor": {"ppo_mini_batch_size": s["ppo_mini_batch_size"],
                      "ppo_micro_batch_size_per_gpu": s["micro"]},
            "rollout": {"log_prob_micro_batch_size_per_gpu": s["log_prob_micro"], "n": 1},
            "ref": {"log_prob_micro_batch_size_per_gpu": s.get("ref_micro", s["log_prob_micro"])},
        },
        "critic": {"ppo_micro_batch_size_per_gpu": s["micro"], "model": {"path": model_path}},
        "algorithm": {"adv_estimator": s.get("adv_estimator", "gae"), "use_kl_in_reward": s.get("kl", False)},
        "trainer": {"n_gpus_per_node": 1, "nnodes": 1},
    }


# ----------------------------------------------------------------------------- measurement

class LiveBytes(TorchDispatchMode):
    """Peak bytes of tensor storages created while active (CPU stand-in for the CUDA allocator)."""

    def __init__(self, resident=()):
        super().__init__()
        self.live = self.peak = 0
        self._sizes: dict[int, int] = {}
        self._resident = {t.untyped_storage().data_ptr() for t in _tensors(*resident)}

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                key = s.data_ptr()
                if key not in self._sizes and key not in self._resident and s.nbytes():
                    self._sizes[key] = s.nbytes()
                    self.live += s.nbytes()
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(s, self._free, key)
        return out


def _tensors(*objects):
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            yield from obj.parameters()
            yield from (p.grad for p in obj.parameters() if p.grad is not None)
            yield from obj.buffers()
        elif isinstance(obj, torch.optim.Optimizer):
            yield from (v for st in obj.state.values() for v in st.values() if isinstance(v, torch.Tensor))


def resident_bytes(*objects) -> int:
    """Bytes of the distinct storages held by modules / optimizers."""
    sizes = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in _tensors(*objects)}
    return sum(sizes.values())


def measure(fn, device: torch.device, resident=()) -> float:
    """Peak allocated GiB while `fn` runs, including state already resident on the device."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / GiB
    tracker = LiveBytes(resident)
    with tracker:
        fn()
    return (resident_bytes(*resident) + tracker.peak) / GiB


# ----------------------------------------------------------------------------- phases

def build_model(config_kwargs: dict, role: str, attn: str, dtype: torch.dtype, device, checkpointing: bool):
    import transformers

    cfg = transformers.Qwen2Config(**config_kwargs)
    cfg._attn_implementation = attn
    cls = transformers.AutoModelForTokenClassification if role == "critic" else transformers.AutoModelForCausalLM
    if role == "critic":
        cfg.num_labels = 1
    torch.manual_seed(0)
    with torch.device(device):
        model = cls.from_config(cfg, torch_dtype=dtype)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    return model


def batch(n: int, prompt: int, response: int, vocab: int, device):
    """Left-padded prompts (one sequence padded, as in real batches) + responses."""
    ids = torch.randint(0, vocab, (n, prompt + response), device=device)
    mask = torch.ones_like(ids)
    mask[0, : prompt // 4] = 0
    return ids, mask


def autocast(device, plan_role):
    if plan_role.compute_dtype == plan_role.param_dtype:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch_dtype(plan_role.compute_dtype))


def forward_log_prob(model, role_plan, ids, mask, response: int, critic: bool):
    with autocast(ids.device, role_plan):
        out = model(input_ids=ids, attention_mask=mask)
        if critic:
            return out.logits[:, -response - 1:-1, 0].float()
        logits = out.logits[:, -response - 1:-1]
        return logprobs_from_logits(logits, ids[:, -response:])


def run_update(model, optimizer, role_plan, setting, device, critic: bool, scaler=None, steps_micro=2):
    """Two micro-batches of fwd+bwd (gradient accumulation) then one AdamW step."""
    micro, p, r = role_plan.micro_batch_size_per_gpu or 1, setting["prompt"], setting["response"]
    model.train()       # HF applies gradient checkpointing only in training mode
    for _ in range(steps_micro):
        ids, mask = batch(micro, p, r, model.config.vocab_size, device)
        out = forward_log_prob(model, role_plan, ids, mask, r, critic)
        loss = (out ** 2).mean() if critic else -out.mean()
        (scaler.scale(loss) if scaler else loss).backward()
        del out, loss
    if role_plan.optimizer_offload:      # an offloaded optimizer visits the device only for its step
        _to(optimizer, device)
    if scaler:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if role_plan.optimizer_offload:
        _to(optimizer, torch.device("cpu"))


@torch.no_grad()
def run_forward(model, role_plan, setting, device, critic: bool):
    micro = role_plan.forward_micro_batch_size_per_gpu or role_plan.micro_batch_size_per_gpu or 1
    model.eval()
    ids, mask = batch(micro, setting["prompt"], setting["response"], model.config.vocab_size, device)
    forward_log_prob(model, role_plan, ids, mask, setting["response"], critic)


@torch.no_grad()
def run_generate(model, rollout_plan, n: int, setting, device):
    """`n` sequences in chunks of `rollout_plan.micro_batch_size` (all at once when unset), as the
    built-in engine generates them; the memory model's rollout phase is one such chunk."""
    model.eval()        # a checkpointed model in training mode would drop the KV cache
    chunk = min(n, rollout_plan.micro_batch_size or n)
    cast = torch.autocast(device_type=device.type, dtype=torch_dtype(rollout_plan.dtype)) \
        if next(model.parameters()).dtype != torch_dtype(rollout_plan.dtype) else contextlib.nullcontext()
    with cast:
        for start in range(0, n, chunk):
            _generate_chunk(model, min(chunk, n - start), setting, device)


def _generate_chunk(model, rows: int, setting, device) -> None:
    """Sampling with HF's KV cache: prefill, then one token per step; the cache dies on return."""
    from transformers import DynamicCache

    ids, mask = batch(rows, setting["prompt"], 0, model.config.vocab_size, device)
    out = model(input_ids=ids, attention_mask=mask, past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
    for _ in range(setting["response"]):
        probs = torch.softmax(out.logits[:, -1].float(), dim=-1)
        nxt = torch.multinomial(probs, 1)
        mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
        out = model(input_ids=nxt, attention_mask=mask, past_key_values=out.past_key_values, use_cache=True)


# ----------------------------------------------------------------------------- one case

def _to(obj, device):
    if isinstance(obj, torch.nn.Module):
        obj.to(device)
    elif isinstance(obj, torch.optim.Optimizer):
        for st in obj.state.values():
            for k, v in st.items():
                if isinstance(v, torch.Tensor) and k != "step":
                    st[k] = v.to(device)


def _override(config: dict, overrides: dict) -> dict:
    for path, value in overrides.items():
        node = config
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return config


def run_case(profile_name: str, setting_name, model_kwargs: dict, device: torch.device,
             software: SoftwareInfo | None = None, rollout_batch: int | None = None,
             overrides: dict | None = None, only: tuple[str, ...] | None = None) -> dict:
    """Plan one (device, setting), run its phases (or `only` those), return predicted and measured GiB."""
    setting = SETTINGS[setting_name] if isinstance(setting_name, str) else setting_name
    profile = get_profile(profile_name)
    software = software or SoftwareInfo(torch_version=torch.__version__)
    import transformers

    spec = ModelSpec.from_hf_config(transformers.Qwen2Config(**model_kwargs))
    config = make_config(setting)
    config["actor_rollout_ref"]["rollout"]["name"] = "hf"
    _override(config, overrides or {})
    plan = make_plan(profile, config, software, spec)
    predicted = {k: v["total_gb"] for k, v in plan.memory["phases_total"].items()}
    result = {"device": profile_name, "setting": setting_name, "predicted": predicted, "measured": {},
              "errors": {}, "memory": plan.memory, "plan": {"actor": dataclasses.asdict(plan.actor),
                                     "rollout": dataclasses.asdict(plan.rollout)}}
    host = torch.device("cpu")
    roles = {}
    try:
        for name, rp in (("actor", plan.actor), ("critic", plan.critic), ("ref", plan.ref)):
            if rp is None:
                continue
            model = build_model(model_kwargs, "critic" if name == "critic" else "actor", rp.attn_implementation,
                                torch_dtype(rp.param_dtype), host, rp.gradient_checkpointing)
            opt = None
            if name != "ref":
                opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
                for p in model.parameters():       # materialise AdamW's two fp32 states
                    opt.state[p]["step"] = torch.tensor(0.0)
                    opt.state[p]["exp_avg"] = torch.zeros_like(p)
                    opt.state[p]["exp_avg_sq"] = torch.zeros_like(p)
            roles[name] = (model, opt, rp)

        def place(active: str):
            """The active role's weights on the device; idle roles' offloaded state on the host."""
            for name, (model, opt, rp) in roles.items():
                _to(model, device if name == active or not rp.param_offload else host)
                if opt is not None:
                    _to(opt, host if rp.optimizer_offload else device)

        def resident():
            return [x for m, o, _ in roles.values() for x in (m, o) if x is not None
                    and next(iter(m.parameters())).device.type == device.type]

        n_gen = rollout_batch or setting["train_batch_size"]
        phases = [("rollout", "actor", lambda: run_generate(roles["actor"][0], plan.rollout, n_gen, setting, device)),
                  ("log_prob", "actor", lambda: run_forward(roles["actor"][0], plan.actor, setting, device, False)),
                  ("ref", "ref", lambda: run_forward(roles["ref"][0], plan.ref, setting, device, False)),
                  ("values", "critic", lambda: run_forward(roles["critic"][0], plan.critic, setting, device, True)),
                  ("critic_update", "critic", lambda: run_update(*roles["critic"][:2], plan.critic, setting, device,
                                                                 True, _scaler(plan.critic, device))),
                  ("actor_update", "actor", lambda: run_update(*roles["actor"][:2], plan.actor, setting, device,
                                                               False, _scaler(plan.actor, device)))]
        for phase, active, fn in phases:
            if active not in roles or (only and phase not in only):
                continue
            place(active)
            try:
                result["measured"][phase] = round(measure(fn, device, resident() if device.type == "cpu" else ()), 3)
            except torch.OutOfMemoryError as exc:
                result["errors"][phase] = f"OOM: {str(exc).splitlines()[0]}"
    finally:
        roles.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


def _scaler(role_plan, device):
    if role_plan.grad_scaler and device.type == "cuda":
        return torch.amp.GradScaler("cuda")
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--devices", default="p40,t4,a100-40gb,h200")
    ap.add_argument("--settings", default="field_report,quickstart")
    ap.add_argument("--phases", default=None, help="comma-separated subset, e.g. rollout,actor_update")
    ap.add_argument("--rollout-batch", type=int, default=None,
                    help="sequences generated per case (default: the setting's train batch)")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows, t0 = [], time.time()
    for dev in args.devices.split(","):
        for setting in args.settings.split(","):
            try:
                row = run_case(dev, setting, QWEN25_05B, device, rollout_batch=args.rollout_batch,
                               only=tuple(args.phases.split(",")) if args.phases else None)
            except Exception as exc:  # noqa: BLE001 (a PlanError or a failed case is a result too)
                row = {"device": dev, "setting": setting, "error": f"{type(exc).__name__}: {exc}"}
            rows.append(row)
            _print_row(row)
    Path(args.out).write_text(json.dumps({"device": str(device), "torch": torch.__version__,
                                          "seconds": round(time.time() - t0, 1), "cases": rows}, indent=2))
    return 0


def _print_row(row: dict) -> None:
    if "error" in row:
        print(f"{row['device']:10s} {row['setting']:13s} {row['error']}")
        return
    for phase, pred in row["predicted"].items():
        meas = row["measured"].get(phase)
        if meas is None and phase not in row["errors"]:
            continue
        err = row["errors"].get(phase, "")
        diff = f"{100 * (pred - meas) / meas:+6.1f}%" if meas else ""
        print(f"{row['device']:10s} {row['setting']:13s} {phase:14s} predicted {pred:7.2f} GiB  "
              f"measured {meas if meas is not None else float('nan'):7.2f} GiB  {diff} {err}")


if __name__ == "__main__":
    sys.exit(main())

"""Config checks that run before anything heavy is imported.

Two jobs, both meant to fail in the first second of a run rather than minutes in:

* `check_overrides(argv)` looks at the command-line overrides before Hydra composes them. An unknown
  key gets an error naming the closest real keys (Hydra's own message names none), and keys that real
  scripts get wrong have an alias table that says exactly what to write instead.
* `validate(config)` applies upstream's consistency rules (batch sizes, micro-batch settings,
  divisibility by the number of devices, allowed values) with messages that say what to change.
  `auto` is legal wherever a hardware decision is left to `verl.compat`.

Only omegaconf is imported here (Hydra lazily, in `load_config`); never torch, ray or transformers.
"""
from __future__ import annotations

import difflib
import re
from functools import lru_cache
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

CONFIG_DIR = Path(__file__).parent / "config"
CONFIG_NAME = "ppo_trainer"
INERT_NAME = "upstream_inert"


class ConfigError(ValueError):
    """A config the run cannot start with; the message says what to change."""


# --------------------------------------------------------------------------------------------------
# The key tree
# --------------------------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _packaged(name: str) -> DictConfig:
    """One packaged YAML file without Hydra's `defaults` list, read once per process (every check reads
    these, and parsing them again slows the command line). Shared: callers must not change it."""
    config = OmegaConf.load(CONFIG_DIR / f"{name}.yaml")
    config.pop("defaults", None)
    return config


@lru_cache(maxsize=1)
def base_config() -> DictConfig:
    """The composed default tree (what Hydra builds with no overrides), without resolving."""
    return OmegaConf.merge(_packaged(INERT_NAME), _packaged(CONFIG_NAME))


def inert_config() -> DictConfig:
    return _packaged(INERT_NAME)


def _leaf_paths(node: DictConfig, prefix: str = "") -> list[str]:
    out = []
    for key in node.keys():
        path = f"{prefix}{key}"
        child = node._get_node(key)
        out.append(path)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            out.extend(_leaf_paths(child, path + "."))
    return out


@lru_cache(maxsize=1)
def all_paths() -> tuple[str, ...]:
    """Every dotted key path of the default tree (inner nodes included)."""
    return tuple(_leaf_paths(base_config()))


@lru_cache(maxsize=1)
def _inert_paths() -> frozenset[str]:
    return frozenset(_leaf_paths(inert_config())) - frozenset(_leaf_paths(_packaged(CONFIG_NAME)))


def _lookup(path: str):
    """(found, node, deepest existing prefix) for a dotted path in the default tree."""
    node = base_config()
    parts = path.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, DictConfig) or part not in node:
            return False, node, ".".join(parts[:i])
        node = node._get_node(part)
    return True, node, path


# --------------------------------------------------------------------------------------------------
# Known wrong keys
# --------------------------------------------------------------------------------------------------

# Leaf names people write, mapped to the real leaf(s) in the same section.
_LEAF_ALIASES = {
    "learning_rate": ("lr",),
    "cpu_offload": ("param_offload", "optimizer_offload"),
    "offload_params": ("param_offload",),
    "offload_param": ("param_offload",),
    "params_offload": ("param_offload",),
    "parameter_offload": ("param_offload",),
    "offload_optimizer": ("optimizer_offload",),
    "optim_offload": ("optimizer_offload",),
    "optimizer_cpu_offload": ("optimizer_offload",),
}

# Sections that moved or never existed, mapped to where their keys live.
_SECTION_MOVES = {
    "actor_rollout_ref.fsdp_config": "actor_rollout_ref.actor.fsdp_config",
    "actor_rollout_ref.model.fsdp_config": "actor_rollout_ref.actor.fsdp_config",
    "actor_rollout_ref.fsdp": "actor_rollout_ref.actor.fsdp_config",
    "critic.model.fsdp_config": "critic.fsdp",
    "critic.fsdp_config": "critic.fsdp",
}

_REMOVED = {
    "grad_offload": "it was removed upstream: gradients follow the parameters, so param_offload covers "
                    "them. Delete this override.",
}


def _alias_hint(path: str, value: str | None) -> str | None:
    """A precise 'write this instead' for keys known to be wrong, or None."""
    parts = path.split(".")
    section, leaf = ".".join(parts[:-1]), parts[-1]
    fixed_section = _SECTION_MOVES.get(section)
    if fixed_section is None and _lookup(section)[0]:
        fixed_section = section
    if fixed_section is None:
        return None
    shown = f"={value}" if value is not None else ""
    if leaf in _REMOVED and _lookup(f"{fixed_section}.param_offload")[0]:
        return f"'{path}' does not exist; {_REMOVED[leaf]}"
    real_leaves = _LEAF_ALIASES.get(leaf, (leaf,))
    targets = [f"{fixed_section}.{name}" for name in real_leaves if _lookup(f"{fixed_section}.{name}")[0]]
    if not targets or targets == [path]:
        return None
    lines = [f"'{path}' is not a config key. Write instead:"]
    lines += [f"    {t}{shown}" for t in targets]
    if fixed_section == "actor_rollout_ref.actor.fsdp_config" and any("offload" in t for t in targets):
        lines.append(f"  (the reference model has its own: actor_rollout_ref.ref.fsdp_config.param_offload{shown};")
        lines.append("   left at `auto`, offload is chosen by the compat memory model only when the model "
                     "would not fit)")
    return "\n".join(lines)


def closest_keys(path: str, n: int = 5) -> list[str]:
    """Real keys nearest to `path`, scored on the whole dotted path and on the last name alone."""
    leaf = path.rsplit(".", 1)[-1]

    def score(candidate: str) -> float:
        whole = difflib.SequenceMatcher(None, path, candidate).ratio()
        last = difflib.SequenceMatcher(None, leaf, candidate.rsplit(".", 1)[-1]).ratio()
        return (whole + last) / 2

    candidates = [p for p in all_paths() if not path.startswith(p + ".")]
    ranked = sorted(candidates, key=score, reverse=True)
    return [p for p in ranked[:n] if score(p) >= 0.6]


def unknown_key_message(path: str, value: str | None = None, added: bool = False) -> str:
    hint = _alias_hint(path, value)
    if hint:
        return hint
    msg = [f"'{path}' is not a config key."]
    near = closest_keys(path)
    if near:
        msg.append("Closest real keys:")
        msg += [f"    {p}" for p in near]
    else:
        found, node, prefix = _lookup(path)
        if prefix and isinstance(node, DictConfig):
            keys = ", ".join(map(str, node.keys()))
            msg.append(f"Keys under '{prefix}': {keys}" if keys else f"'{prefix}' holds no keys by default.")
    if not added:
        msg.append("To add a key that is not in the config on purpose, write +" + path + "=...")
    return "\n".join(msg)


# --------------------------------------------------------------------------------------------------
# Command-line overrides
# --------------------------------------------------------------------------------------------------

# Hydra flags that take the next argument as their value.
_FLAGS_WITH_VALUE = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
                     "--cfg", "-c", "--package", "-p", "--experimental-rerun"}
# Sections whose contents are free-form: keys added under them are passed through as given.
_OPEN_SECTIONS = ("override_config", "engine_kwargs", "runtime_env", "env_vars", "ray_init",
                  "apply_chat_template_kwargs", "mm_processor_kwargs", "sampler_kwargs", "kw_args")

# upstream's Hydra config groups, written from the packaged config (verl/trainer/config/groups.py)
_CONFIG_GROUPS = ("actor", "ref", "rollout", "model", "critic", "data", "reward", "algorithm", "distillation",
                  "transfer_queue")

_OVERRIDE_RE = re.compile(r"^(?P<op>\+\+|\+|~)?(?P<key>[^=]+?)(?:=(?P<value>.*))?$", re.DOTALL)


def _is_open(path: str) -> bool:
    found, node, prefix = _lookup(path)
    if any(part in _OPEN_SECTIONS for part in path.split(".")[:-1]):
        return True
    return isinstance(node, DictConfig) and len(node) == 0 and bool(prefix)


def check_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """Check Hydra command-line arguments against the key tree.

    Returns (arguments to hand to Hydra, warnings). `+key=value` for a key that already exists here
    (this fork adds a few keys upstream lacks, e.g. `fsdp_config.mixed_precision`) becomes
    `++key=value`, so upstream scripts that add such keys keep working. Raises ConfigError listing
    every unknown key.
    """
    out: list[str] = []
    warnings: list[str] = []
    errors: list[str] = []
    custom_config = any(a.split("=")[0] in ("--config-name", "-cn", "--config-path", "-cp",
                                            "--config-dir", "-cd") for a in argv)
    skip_next = False
    for arg in argv:
        if skip_next:
            out.append(arg)
            skip_next = False
            continue
        if arg.startswith("-"):
            out.append(arg)
            skip_next = arg in _FLAGS_WITH_VALUE
            continue
        m = _OVERRIDE_RE.match(arg)
        if not m or (m.group("value") is None and m.group("op") != "~"):
            errors.append(f"'{arg}' is not an override; write key=value (or +key=value to add a key).")
            continue
        op, key, value = m.group("op") or "", m.group("key").strip(), m.group("value")
        if custom_config or key.startswith("hydra.") or key == "hydra":
            out.append(arg)
            continue
        if "@" in key or "/" in key:
            if key.split("@")[0].split("/")[0] in _CONFIG_GROUPS:  # a group option: Hydra names a missing one
                out.append(arg)
            else:
                errors.append(f"'{key}': not one of upstream's config groups here ({', '.join(_CONFIG_GROUPS)}); "
                              "set keys with key=value.")
            continue
        found = _lookup(key)[0]
        if op == "++":
            out.append(arg)
        elif op == "+":
            if found:
                out.append("+" + arg)
            elif _is_open(key):
                out.append(arg)
            else:
                hint = _alias_hint(key, value)
                leaf = key.rsplit(".", 1)[-1]
                parent_found, parent, _ = _lookup(key.rsplit(".", 1)[0]) if "." in key else (True, base_config(), "")
                siblings = list(parent.keys()) if parent_found and isinstance(parent, DictConfig) else []
                typo = difflib.get_close_matches(leaf, [str(s) for s in siblings], n=1, cutoff=0.8)
                if hint or typo:
                    errors.append(unknown_key_message(key, value, added=True))
                else:
                    out.append(arg)
                    warnings.append(f"'{key}' is added to the config but nothing in this fork reads it.")
        elif op == "~":
            if not found:
                errors.append(unknown_key_message(key, value))
            else:
                out.append(arg)
        else:
            if found:
                out.append(arg)
            else:
                errors.append(unknown_key_message(key, value))
    if errors:
        raise ConfigError("\n\n".join(errors))
    return out, warnings


# --------------------------------------------------------------------------------------------------
# Consistency rules on the composed config
# --------------------------------------------------------------------------------------------------

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                  "seq-mean-token-sum-norm")
# Advantage estimators this fork implements (verl.trainer.ppo.core_algos registry; a test keeps the
# two in step) and upstream ones it does not.
ADV_ESTIMATORS = ("gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo", "remax", "opo",
                  "grpo_passk", "gpg", "rloo_vectorized", "grpo_vectorized", "gdpo")
UPSTREAM_ONLY_ADV_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")
# actor.policy_loss.loss_mode values (the core_algos policy-loss registry; a test keeps the two in step).
POLICY_LOSS_MODES = ("vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo", "dppo_tv",
                     "dppo_kl", "dro")
UPSTREAM_ONLY_POLICY_LOSS_MODES = ("bypass_mode",)
# KL estimators of core_algos.kl_penalty, and their straight-through forms: a trailing '+' keeps the
# estimator's value with the k2 gradient (a test keeps this list in step with core_algos).
_KL_BASE = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_ESTIMATORS = _KL_BASE + tuple(f"{name}+" for name in _KL_BASE)
# upstream's engine names; the planner replaces one this verl does not ship (sglang, trtllm) by its own
# choice and says so, as it replaces vllm where vLLM cannot run
ROLLOUT_NAMES = ("auto", "hf", "vllm", "sglang", "trtllm")
DEVICES = ("auto", "cuda", "cpu")
TRUNCATIONS = ("error", "left", "right", "middle")


def _get(cfg: DictConfig, path: str, default=None):
    return OmegaConf.select(cfg, path, default=default, throw_on_missing=False)


def _explicit(cfg: DictConfig, path: str):
    """The value at `path`, or None when it is only an interpolation of another key (not set by the user)."""
    parent_path, _, leaf = path.rpartition(".")
    parent = _get(cfg, parent_path) if parent_path else cfg
    if isinstance(parent, DictConfig) and leaf in parent and OmegaConf.is_interpolation(parent, leaf):
        return None
    return _get(cfg, path)


def _is_auto(value) -> bool:
    return isinstance(value, str) and value == "auto"


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def need_critic(cfg: DictConfig) -> bool:
    enable = _get(cfg, "critic.enable")
    if enable is not None:
        return bool(enable)
    return _get(cfg, "algorithm.adv_estimator") == "gae"


def need_reference_policy(cfg: DictConfig) -> bool:
    return bool(_get(cfg, "algorithm.use_kl_in_reward")) or bool(_get(cfg, "actor_rollout_ref.actor.use_kl_loss"))


def _one_micro_batch(cfg, section: str, name: str, errors: list[str]) -> None:
    """Exactly one of the deprecated global micro-batch and its per-GPU replacement must be set."""
    global_key, per_gpu_key = f"{section}.{name}", f"{section}.{name}_per_gpu"
    mbs, per_gpu = _explicit(cfg, global_key), _explicit(cfg, per_gpu_key)
    if mbs is None and per_gpu is None:
        errors.append(f"Set {per_gpu_key}=<int> (micro-batch per device; `auto` lets compat pick it), "
                      f"or actor_rollout_ref.actor.use_dynamic_bsz=true to batch by token budget.")
    elif mbs is not None and per_gpu is not None:
        errors.append(f"Both {global_key}={mbs} and {per_gpu_key}={per_gpu} are set. Remove {global_key} "
                      f"(deprecated, counted over all devices) and keep {per_gpu_key}.")
    for key, value in ((global_key, mbs), (per_gpu_key, per_gpu)):
        if value is not None and not _is_auto(value) and not _positive_int(value):
            errors.append(f"{key}={value!r} must be a positive integer or auto.")


def _check_batches(cfg, errors: list[str], warnings: list[str]) -> None:
    n_devices = (_get(cfg, "trainer.n_gpus_per_node") or 0) * (_get(cfg, "trainer.nnodes") or 0)
    train_bs = _get(cfg, "data.train_batch_size")
    n = _get(cfg, "actor_rollout_ref.rollout.n")
    for key, value in (("trainer.n_gpus_per_node", _get(cfg, "trainer.n_gpus_per_node")),
                       ("trainer.nnodes", _get(cfg, "trainer.nnodes")),
                       ("data.train_batch_size", train_bs), ("actor_rollout_ref.rollout.n", n)):
        if not _positive_int(value):
            errors.append(f"{key}={value!r} must be a positive integer.")
    if errors:
        return
    # `auto` may resolve to fixed micro-batches (CPU), so it needs them set like `false` does.
    dynamic = _get(cfg, "actor_rollout_ref.actor.use_dynamic_bsz") is True
    samples = train_bs * n
    if not dynamic and samples % n_devices:
        errors.append(
            f"data.train_batch_size × rollout.n = {train_bs} × {n} = {samples} responses per step must "
            f"divide evenly over trainer.n_gpus_per_node × trainer.nnodes = {n_devices} devices. "
            f"Make data.train_batch_size a multiple of {n_devices // _gcd(n, n_devices)}.")

    roles = [("actor_rollout_ref.actor", "actor")]
    if need_critic(cfg):
        roles.append(("critic", "critic"))
    for section, role in roles:
        mini = _get(cfg, f"{section}.ppo_mini_batch_size")
        if not _positive_int(mini):
            errors.append(f"{section}.ppo_mini_batch_size={mini!r} must be a positive integer.")
            continue
        if not dynamic:
            _one_micro_batch(cfg, section, "ppo_micro_batch_size", errors)
        if mini > train_bs:
            errors.append(f"{section}.ppo_mini_batch_size={mini} is larger than data.train_batch_size="
                          f"{train_bs}. Set it to at most {train_bs} (both count prompts).")
            continue
        if train_bs % mini:
            errors.append(f"data.train_batch_size={train_bs} is not a multiple of {section}.ppo_mini_batch_size="
                          f"{mini}: the last mini-batch would be short. Use a divisor of {train_bs}, "
                          f"e.g. {_largest_divisor_at_most(train_bs, mini)}.")
        if dynamic:
            continue
        mini_samples = mini * n
        if mini_samples % n_devices:
            errors.append(f"{section}.ppo_mini_batch_size × rollout.n = {mini} × {n} = {mini_samples} must "
                          f"divide evenly over {n_devices} devices; pick a mini-batch that makes it so.")
            continue
        # with Ulysses the ranks of a sequence-parallel group share their rows: data-parallel size = devices / sp
        sp = _ulysses_size(cfg, section, n_devices)
        dp = n_devices // sp
        per_device = mini_samples // dp
        per_gpu = _explicit(cfg, f"{section}.ppo_micro_batch_size_per_gpu")
        if _positive_int(per_gpu) and per_device % per_gpu:
            who = "Each device" if sp == 1 else f"Each sequence-parallel group ({sp} devices)"
            errors.append(f"{who} gets {per_device} responses per {role} mini-batch "
                          f"({mini} × {n} / {dp}), not a multiple of {section}."
                          f"ppo_micro_batch_size_per_gpu={per_gpu}. Use a divisor of {per_device}.")
        mbs = _explicit(cfg, f"{section}.ppo_micro_batch_size")
        if _positive_int(mbs):
            if mini_samples % mbs:
                errors.append(f"{section}.ppo_micro_batch_size={mbs} must divide the mini-batch of "
                              f"{mini_samples} responses; better, use ppo_micro_batch_size_per_gpu.")
            if mbs < n_devices:
                errors.append(f"{section}.ppo_micro_batch_size={mbs} is below the {n_devices} devices it is "
                              f"split over; use ppo_micro_batch_size_per_gpu instead.")

    if not dynamic:
        if need_reference_policy(cfg):
            _one_micro_batch(cfg, "actor_rollout_ref.ref", "log_prob_micro_batch_size", errors)
        _one_micro_batch(cfg, "actor_rollout_ref.rollout", "log_prob_micro_batch_size", errors)


ULYSSES_KEYS = ("actor_rollout_ref.actor.ulysses_sequence_parallel_size",
                "actor_rollout_ref.ref.ulysses_sequence_parallel_size", "critic.ulysses_sequence_parallel_size")


def _ulysses_size(cfg, section: str, n_devices: int) -> int:
    """The section's valid Ulysses size (1 where unset or invalid: `_check_ulysses` reports those)."""
    value = _get(cfg, f"{section}.ulysses_sequence_parallel_size")
    return value if _positive_int(value) and n_devices % value == 0 else 1


def _check_ulysses(cfg, errors: list[str]) -> None:
    """Ulysses sizes are positive divisors of the devices (the heads are checked against the model by
    the planner)."""
    n_devices = (_get(cfg, "trainer.n_gpus_per_node") or 0) * (_get(cfg, "trainer.nnodes") or 0)
    for key in ULYSSES_KEYS:
        value = _get(cfg, key)
        if value is None:
            continue
        if not _positive_int(value):
            errors.append(f"{key}={value!r} must be a positive integer (1 = no sequence parallelism).")
        elif _positive_int(n_devices) and n_devices % value:
            errors.append(f"{key}={value} must divide trainer.n_gpus_per_node × trainer.nnodes = {n_devices}: "
                          "each sequence-parallel group is that many ranks.")


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _largest_divisor_at_most(n: int, k: int) -> int:
    return max(d for d in range(1, k + 1) if n % d == 0)


def _check_choices(cfg, errors: list[str], warnings: list[str]) -> None:
    def one_of(path, allowed, what="", extra=""):
        value = _get(cfg, path)
        if value not in allowed:
            near = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
            did = f" Did you mean {near[0]}?" if near else ""
            errors.append(f"{path}={value!r} is not one of {', '.join(map(str, allowed))}.{did}{extra}")

    one_of("actor_rollout_ref.actor.loss_agg_mode", LOSS_AGG_MODES)
    if _explicit(cfg, "critic.loss_agg_mode") is not None:  # else it follows the actor's
        one_of("critic.loss_agg_mode", LOSS_AGG_MODES)

    def implemented(path, allowed, upstream_only, what, why=None):
        value = _get(cfg, path)
        if value in upstream_only:
            errors.append(f"{path}={value} is an upstream {what} this fork does not implement yet"
                          f"{(why or {}).get(value, '')}; use one of {', '.join(allowed)}.")
        else:
            one_of(path, allowed)

    implemented("algorithm.adv_estimator", ADV_ESTIMATORS, UPSTREAM_ONLY_ADV_ESTIMATORS, "estimator", why={
        "optimal_token_baseline": " (core_algos.compute_optimal_token_baseline_advantage exists, but the actor does "
                                  "not compute the per-token sum of squared probabilities it needs)"})
    if _get(cfg, "algorithm.adv_estimator") == "gdpo" and not _get(cfg, "algorithm.gdpo_reward_keys"):
        errors.append("algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys: the reward components your "
                      "compute_score returns in its dict, e.g. +algorithm.gdpo_reward_keys=[format_reward,accuracy_reward]")
    implemented("actor_rollout_ref.actor.policy_loss.loss_mode", POLICY_LOSS_MODES, UPSTREAM_ONLY_POLICY_LOSS_MODES,
                "policy loss")
    beta = _get(cfg, "actor_rollout_ref.actor.policy_loss.dro_beta")
    if _get(cfg, "actor_rollout_ref.actor.policy_loss.loss_mode") == "dro" and not (
            isinstance(beta, (int, float)) and not isinstance(beta, bool) and beta > 0):
        errors.append(f"actor_rollout_ref.actor.policy_loss.dro_beta={beta!r}: loss_mode=dro needs a positive "
                      "dro_beta (e.g. 0.1).")
    est = _get(cfg, "algorithm.adv_estimator")
    for path in ("actor_rollout_ref.actor.kl_loss_type", "algorithm.kl_penalty"):
        value = _get(cfg, path)
        if value not in KL_ESTIMATORS:
            near = difflib.get_close_matches(str(value), KL_ESTIMATORS, n=1)
            errors.append(f"{path}={value!r} is not a KL estimator; use one of {', '.join(_KL_BASE)}, or "
                          f"one with a trailing + for the k2 gradient (e.g. low_var_kl+)."
                          + (f" Did you mean {near[0]}?" if near else ""))
    one_of("algorithm.kl_ctrl.type", ("fixed", "adaptive"))
    one_of("data.truncation", TRUNCATIONS)
    one_of("actor_rollout_ref.rollout.name", ROLLOUT_NAMES)
    one_of("trainer.device", DEVICES)
    for role in ("actor_rollout_ref.actor", "critic"):
        one_of(f"{role}.strategy", ("fsdp", "fsdp2"), extra=" This fork trains with FSDP only.")

    # dtype and attention names are checked by verl.compat, which owns those vocabularies
    for fsdp in ("actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.fsdp"):
        for leaf in ("param_offload", "optimizer_offload", "use_torch_compile", "reshard_after_forward"):
            _bool_or_auto(cfg, f"{fsdp}.{leaf}", errors)
    for path in ("actor_rollout_ref.model.use_remove_padding", "critic.model.use_remove_padding",
                 "actor_rollout_ref.actor.use_torch_compile", "actor_rollout_ref.rollout.enforce_eager"):
        _bool_or_auto(cfg, path, errors)
    gmu = _get(cfg, "actor_rollout_ref.rollout.gpu_memory_utilization")
    if not _is_auto(gmu) and not (isinstance(gmu, (int, float)) and not isinstance(gmu, bool) and 0 < gmu <= 1):
        errors.append(f"actor_rollout_ref.rollout.gpu_memory_utilization={gmu!r} must be in (0, 1] or auto.")

    margin = _get(cfg, "compat.memory_margin")
    if not (isinstance(margin, (int, float)) and not isinstance(margin, bool) and 0 <= margin < 0.9):
        errors.append(f"compat.memory_margin={margin!r} must be a fraction in [0, 0.9), e.g. 0.1.")
    _check_lora(cfg, errors)
    for path in ("compat.strict", "compat.numerics_guard", "compat.always_fsdp"):
        if not isinstance(_get(cfg, path), bool):
            errors.append(f"{path}={_get(cfg, path)!r} must be true or false.")
    if _get(cfg, "compat.compile_warmup") is not None:
        one_of("compat.compile_warmup", ("auto", "background", "synchronous", "off"),
               extra=" (verl/compat/planning/compile.py)")
    folder = _get(cfg, "compat.compile_cache_dir")
    if folder is not None and not (isinstance(folder, str) and folder.strip()):
        errors.append(f"compat.compile_cache_dir={folder!r} must be a folder or auto.")

    if _get(cfg, "actor_rollout_ref.rollout.val_kwargs.do_sample"):
        temp = _get(cfg, "actor_rollout_ref.rollout.val_kwargs.temperature")
        if not (isinstance(temp, (int, float)) and temp > 0):
            errors.append("actor_rollout_ref.rollout.val_kwargs.do_sample=true needs "
                          "actor_rollout_ref.rollout.val_kwargs.temperature > 0 (it is "
                          f"{temp!r}); set a temperature or do_sample=false for greedy validation.")
    for key in ("data.max_prompt_length", "data.max_response_length"):
        if not _positive_int(_get(cfg, key)):
            errors.append(f"{key}={_get(cfg, key)!r} must be a positive integer.")
    steps = _get(cfg, "trainer.total_training_steps")
    if steps is not None and not _positive_int(steps):
        errors.append(f"trainer.total_training_steps={steps!r} must be a positive integer or null.")

    if _get(cfg, "algorithm.use_kl_in_reward") and _get(cfg, "actor_rollout_ref.actor.use_kl_loss"):
        warnings.append("Both algorithm.use_kl_in_reward and actor_rollout_ref.actor.use_kl_loss are on: "
                        "the KL to the reference policy is penalised twice.")
    if est == "grpo_passk" and _get(cfg, "actor_rollout_ref.rollout.n") == 1:
        errors.append("algorithm.adv_estimator=grpo_passk credits the best of each prompt's responses and needs "
                      "actor_rollout_ref.rollout.n >= 2.")
    if est in ("grpo", "rloo") and _get(cfg, "actor_rollout_ref.rollout.n") == 1:
        warnings.append(f"algorithm.adv_estimator={est} with actor_rollout_ref.rollout.n=1: every group has one "
                        "response, so every advantage is 0. Set rollout.n to 2 or more (e.g. 5).")
    if _get(cfg, "data.val_batch_size") is not None:
        warnings.append("data.val_batch_size is deprecated upstream and ignored: validation runs as one batch.")


def _check_lora(cfg, errors: list[str]) -> None:
    """LoRA ranks are whole numbers; the 4-bit base (QLoRA) needs LoRA adapters to train."""
    for model in ("actor_rollout_ref.model", "critic.model"):
        rank = _get(cfg, f"{model}.lora_rank")
        if rank is not None and not (isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0):
            errors.append(f"{model}.lora_rank={rank!r} must be a whole number >= 0 (e.g. 32; 0 trains every weight).")
    four_bit = _get(cfg, "actor_rollout_ref.model.load_in_4bit")
    if not isinstance(four_bit, bool):
        errors.append(f"actor_rollout_ref.model.load_in_4bit={four_bit!r} must be true or false.")
    elif four_bit and _get(cfg, "actor_rollout_ref.model.lora_rank") in (0, None):
        errors.append("actor_rollout_ref.model.load_in_4bit=true stores the frozen base of a LoRA model in 4 bits: "
                      "set actor_rollout_ref.model.lora_rank too (e.g. 32), or load_in_4bit=false.")


# Numeric keys and the ranges they must lie in: (path, lowest, highest, lowest allowed?, highest allowed?, what).
# A value of None (unset) passes; `auto` passes where compat decides the value.
_A, _C = "actor_rollout_ref.actor", "critic"
_RANGES = (
    *((f"{role}.optim.lr", 0.0, None, True, False, "a learning rate, e.g. 1e-6") for role in (_A, _C)),
    *((f"{role}.optim.{key}", 0.0, 1.0, True, True, "a fraction of the training steps")
      for role in (_A, _C) for key in ("lr_warmup_steps_ratio", "min_lr_ratio")),
    *((f"{role}.optim.weight_decay", 0.0, None, True, False, "a weight decay, e.g. 0.01") for role in (_A, _C)),
    *((f"{role}.grad_clip", 0.0, None, False, False, "a gradient-norm limit, e.g. 1.0") for role in (_A, _C)),
    *((f"{role}.loss_scale_factor", 0.0, None, False, False, "a loss scale") for role in (_A, _C)),
    (f"{_A}.clip_ratio", 0.0, None, False, False, "the PPO clip range, e.g. 0.2"),
    (f"{_A}.clip_ratio_low", 0.0, None, True, False, "the lower PPO clip range, e.g. 0.2"),
    (f"{_A}.clip_ratio_high", 0.0, None, True, False, "the upper PPO clip range, e.g. 0.28"),
    (f"{_A}.clip_ratio_c", 1.0, None, False, False, "dual-clip PPO's bound, above 1, e.g. 3.0"),
    (f"{_A}.entropy_coeff", 0.0, None, True, False, "the entropy bonus, e.g. 0 or 0.001"),
    (f"{_A}.kl_loss_coef", 0.0, None, True, False, "the KL loss weight, e.g. 0.001"),
    (f"{_A}.tau_pos", 0.0, None, False, False, "SAPO's temperature for positive advantages"),
    (f"{_A}.tau_neg", 0.0, None, False, False, "SAPO's temperature for negative advantages"),
    (f"{_A}.policy_loss.clip_cov_ratio", 0.0, 1.0, False, True, "a fraction of the tokens"),
    (f"{_A}.policy_loss.kl_cov_ratio", 0.0, 1.0, False, True, "a fraction of the tokens"),
    (f"{_A}.policy_loss.ppo_kl_coef", 0.0, None, True, False, "a KL weight"),
    (f"{_C}.cliprange_value", 0.0, None, False, False, "the value clip range, e.g. 0.5"),
    ("algorithm.kl_ctrl.kl_coef", 0.0, None, True, False, "the KL penalty weight, e.g. 0.001"),
    ("algorithm.kl_ctrl.target_kl", 0.0, None, False, False, "the adaptive KL target, e.g. 0.1"),
    ("algorithm.kl_ctrl.horizon", 0.0, None, False, False, "the adaptive KL horizon in samples"),
    ("algorithm.gamma", 0.0, 1.0, True, True, "a discount factor"),
    ("algorithm.lam", 0.0, 1.0, True, True, "the GAE lambda"),
    ("actor_rollout_ref.rollout.temperature", 0.0, None, True, False, "a sampling temperature"),
    ("actor_rollout_ref.rollout.val_kwargs.temperature", 0.0, None, True, False, "a sampling temperature"),
    ("actor_rollout_ref.rollout.top_p", 0.0, 1.0, False, True, "a nucleus-sampling mass"),
    ("actor_rollout_ref.rollout.val_kwargs.top_p", 0.0, 1.0, False, True, "a nucleus-sampling mass"),
)
# Integer keys: (path, smallest value, what); `auto` passes.
_INT_RANGES = (
    *((f"{role}.ppo_epochs", 1, "passes over each batch") for role in (_A, _C)),
    *((f"{role}.ppo_max_token_len_per_gpu", 1, "a token budget per device") for role in (_A, _C)),
    ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", 1, "a token budget per device"),
    ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", 1, "a token budget per device"),
    ("actor_rollout_ref.rollout.top_k", -1, "-1 (off) or a number of tokens"),
    ("actor_rollout_ref.rollout.val_kwargs.top_k", -1, "-1 (off) or a number of tokens"),
    ("actor_rollout_ref.rollout.val_kwargs.n", 1, "responses per validation prompt"),
    ("trainer.total_epochs", 1, "passes over the data"),
    ("trainer.critic_warmup", 0, "steps"),
)


def _check_ranges(cfg, errors: list[str]) -> None:
    """Numbers out of their range (a negative learning rate, a clip ratio of 0, gamma above 1), naming the key."""
    import math

    for path, low, high, low_ok, high_ok, what in _RANGES:
        value = _get(cfg, path)
        if value is None or _is_auto(value):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            errors.append(f"{path}={value!r} must be a number ({what}).")
            continue
        below = value < low or (value == low and not low_ok)
        above = high is not None and (value > high or (value == high and not high_ok))
        if below or above:
            span = ("[" if low_ok else "(") + f"{low:g}, " + (f"{high:g}" + ("]" if high_ok else ")") if high is not None
                                                               else "inf)")
            errors.append(f"{path}={value!r} is out of range: it must be in {span} ({what}).")
    for path, low, what in _INT_RANGES:
        value = _get(cfg, path)
        if value is None or _is_auto(value):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            errors.append(f"{path}={value!r} must be an integer >= {low} ({what}).")


def _bool_or_auto(cfg, path: str, errors: list[str]) -> None:
    value = _get(cfg, path)
    if not (isinstance(value, bool) or _is_auto(value)):
        errors.append(f"{path}={value!r} must be true, false or auto.")


# Switches for upstream features this fork does not implement: (path, is-on test, what it is).
_UNSUPPORTED = (
    ("actor_rollout_ref.model.lora.rank", lambda v: isinstance(v, int) and v > 0,
     "Megatron's LoRA block (FSDP LoRA: actor_rollout_ref.model.lora_rank)"),
    ("trainer.v1.trainer_mode", lambda v: v != "sync", "asynchronous trainers"),
)
_SWITCH_LEAF = re.compile(r"^(enable|enabled|enable_.*)$")
# Keys of this verl's own tree that upstream's trainer reads and this one does not apply: a changed value is
# said at start-up (prefix of the keys, why).
_NOT_APPLIED = (
    ("algorithm.rollout_correction.", "the trainer computes no rollout-correction weights, the old log-probs are "
                                      "always the actor's (docs/upstream/compatibility.md)"),
    ("actor_rollout_ref.rollout.over_sample_rate", "every rollout waits for all of its sequences"),
    ("trainer.log_val_generations", "validation samples go to trainer.validation_data_dir, not to a logger table"),
)


def _check_unsupported(cfg, errors: list[str], warnings: list[str]) -> None:
    for path, is_on, what in _UNSUPPORTED:
        value = _get(cfg, path)
        if is_on(value):
            errors.append(f"{path}={value!r} asks for {what}, which this fork does not implement; "
                          f"remove the override.")
    base = base_config()
    for prefix, why in _NOT_APPLIED:
        for path in (p for p in all_paths() if p == prefix or (prefix.endswith(".") and p.startswith(prefix))):
            default, value = OmegaConf.select(base, path), _get(cfg, path)
            if not isinstance(default, (DictConfig, ListConfig)) and value != default:
                warnings.append(f"{path}={value!r} is accepted for compatibility with upstream but has no effect "
                                f"here: {why}.")
    inert = inert_config()
    for path in sorted(_inert_paths()):
        default = OmegaConf.select(inert, path)
        if isinstance(default, (DictConfig, ListConfig)):
            continue
        value = _get(cfg, path, default)
        if isinstance(value, (DictConfig, ListConfig)) or value == default:
            continue
        if _SWITCH_LEAF.match(path.rsplit(".", 1)[-1]) and value:
            errors.append(f"{path}={value!r} switches on an upstream feature this fork does not implement; "
                          f"remove the override.")
        else:
            warnings.append(f"{path}={value!r} is accepted for compatibility with upstream but has no effect here.")


def normalize(cfg: DictConfig) -> None:
    """Fold upstream's spelling of the attention choice into this fork's key, and the legacy
    `reward_model.*` keys into `reward.reward_model.*`.

    Upstream reads the attention kernel from `model.override_config.attn_implementation`; compat reads
    `model.attn_implementation`. A value given the upstream way counts as the user's explicit choice.
    The legacy reward-model keys that are set are copied over the new ones, as upstream 0.9.1 does.
    """
    _migrate_legacy_reward_model(cfg)
    for model in ("actor_rollout_ref.model", "critic.model"):
        override = _get(cfg, f"{model}.override_config.attn_implementation")
        if override is None:
            continue
        current = _get(cfg, f"{model}.attn_implementation")
        if _is_auto(current):
            OmegaConf.update(cfg, f"{model}.attn_implementation", override, force_add=True)
        elif current != override:
            raise ConfigError(f"{model}.attn_implementation={current} and "
                              f"{model}.override_config.attn_implementation={override} disagree; keep one.")


def _migrate_legacy_reward_model(cfg: DictConfig) -> None:
    legacy = OmegaConf.select(cfg, "reward_model")
    if not isinstance(legacy, DictConfig):
        return
    moves = {"enable": "enable", "enable_resource_pool": "enable_resource_pool",
             "n_gpus_per_node": "n_gpus_per_node", "nnodes": "nnodes", "model.path": "model_path"}
    moves.update({f"rollout.{k}": f"rollout.{k}" for k in (legacy.get("rollout") or {})})
    for old, new in moves.items():
        value = OmegaConf.select(legacy, old)
        if value is not None and not isinstance(value, DictConfig):
            OmegaConf.update(cfg, f"reward.reward_model.{new}", value, force_add=True)


def _check_reward_model(cfg: DictConfig, errors: list[str]) -> None:
    """Read here without verl.compat (importing it loads torch); `normalize` merged the legacy keys."""
    on = OmegaConf.select(cfg, "reward.reward_model.enable") or OmegaConf.select(cfg, "reward_model.enable")
    path = OmegaConf.select(cfg, "reward.reward_model.model_path") or OmegaConf.select(cfg, "reward_model.model.path")
    if on and not path:
        errors.append("reward.reward_model.enable=True needs the reward model's folder: set "
                      "reward.reward_model.model_path (or reward_model.model.path)")


def validate(cfg: DictConfig) -> list[str]:
    """Apply every consistency rule; raise ConfigError listing all problems, else return warnings."""
    errors: list[str] = []
    warnings: list[str] = []
    _check_choices(cfg, errors, warnings)
    _check_ranges(cfg, errors)
    _check_unsupported(cfg, errors, warnings)
    _check_ulysses(cfg, errors)
    _check_reward_model(cfg, errors)
    batch_errors: list[str] = []
    _check_batches(cfg, batch_errors, warnings)
    errors += batch_errors
    if errors:
        raise ConfigError("\n".join(f"- {e}" for e in errors))
    return warnings


def load_config(overrides: list[str] | None = None, check: bool = True) -> DictConfig:
    """Compose the config exactly as `main_ppo` does (for the doctor, tests and scripts)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    args, _ = check_overrides(list(overrides or []))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name=CONFIG_NAME, overrides=args)
    if check:
        normalize(cfg)
        validate(cfg)
    return cfg

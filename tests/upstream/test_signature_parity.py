"""Upstream 0.9.1's signatures for the names this verl serves under upstream's paths: each upstream parameter,
in upstream's order, with its kind and (literal) default; this verl may add parameters after them. Read from the
unpacked 0.9.1 wheel with ast (VERL_UPSTREAM_SRC, default /tmp/up/src); skipped where it is not present."""
import ast
import importlib
import inspect
import os
from pathlib import Path

import pytest

UPSTREAM = Path(os.environ.get("VERL_UPSTREAM_SRC", "/tmp/up/src"))

# (module, qualified name)
NAMES = [
    ("verl.trainer.ppo.ray_trainer", "RayPPOTrainer.__init__"),
    ("verl.utils.dataset.rl_dataset", "collate_fn"),
    ("verl.utils.seqlen_balancing", "rearrange_micro_batches"),
    ("verl.utils.seqlen_balancing", "karmarkar_karp"),
    ("verl.utils.seqlen_balancing", "greedy_partition"),
    ("verl.utils.seqlen_balancing", "get_seqlen_balanced_partitions"),
    ("verl.utils.seqlen_balancing", "prepare_dynamic_batch"),
    ("verl.utils.tracking", "Tracking.finish"),
    ("verl.utils.tracking", "Tracking.__init__"),
    ("verl.utils.reward_score", "default_compute_score"),
    ("verl.utils.reward_score", "get_default_compute_score"),
    ("verl.utils.reward_score.prime_math", "compute_score"),
    ("verl.utils.reward_score.prime_code", "compute_score"),
    ("verl.utils.reward_score.sandbox_fusion", "compute_score"),
    ("verl.utils.reward_score.sandbox_fusion.utils", "call_sandbox_api"),
    ("verl.utils.reward_score.math_verify", "compute_score"),
    ("verl.utils.reward_score.math_batch", "compute_score_batched"),
    ("verl.utils.config", "omega_conf_to_dataclass"),
    ("verl.utils.hdfs_io", "exists"),
    ("verl.utils.hdfs_io", "makedirs"),
    ("verl.utils.hdfs_io", "copy"),
    ("verl.utils.py_functional", "timeout_limit"),
    ("verl.utils.py_functional", "append_to_dict"),
    ("verl.utils.import_utils", "load_module"),
    ("verl.utils.import_utils", "load_extern_object"),
    ("verl.utils.model", "get_model_size"),
    ("verl.utils.model", "create_random_mask"),
    ("verl.utils.model", "update_model_config"),
    ("verl.utils.model", "get_generation_config"),
    ("verl.utils.ray_utils", "parallel_put"),
    ("verl.utils.debug.metrics", "calculate_debug_metrics"),
    ("verl.utils.metric.utils", "Metric.__init__"),
    ("verl.trainer.ppo.metric_utils", "bootstrap_metric"),
    ("verl.trainer.ppo.metric_utils", "calc_maj_val"),
    ("verl.trainer.constants_ppo", "get_ppo_ray_runtime_env"),
    ("verl.workers.config.optimizer", "build_optimizer"),
    ("verl.tools.base_tool", "BaseTool.__init__"),
    ("verl.tools.base_tool", "BaseTool.execute"),
    ("verl.tools.function_tool", "function_tool"),
    ("verl.tools.tool_registry", "load_all_tools"),
    ("verl.single_controller.ray.base", "SubRayResourcePool.__init__"),
    ("verl.single_controller.ray.base", "split_resource_pool"),
    ("verl.single_controller.ray.base", "merge_resource_pool"),
    ("verl.protocol", "all_gather_data_proto"),
]


def _upstream_def(module: str, qualname: str):
    base = UPSTREAM.joinpath(*module.split("."))
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    scope = ast.parse(path.read_text(encoding="utf-8")).body
    for part in qualname.split("."):
        node = next(n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                    and n.name == part)
        scope = node.body
    return node


def _upstream_params(fn) -> list[tuple[str, str, object]]:
    """(name, kind, default) per parameter; defaults as Python values where literal, else their source text."""
    args = fn.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    out = []
    for arg, default in zip(positional, defaults):
        out.append((arg.arg, "positional", _value(default)))
    if args.vararg:
        out.append((args.vararg.arg, "var_positional", inspect.Parameter.empty))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        out.append((arg.arg, "keyword_only", _value(default)))
    if args.kwarg:
        out.append((args.kwarg.arg, "var_keyword", inspect.Parameter.empty))
    return out


def _value(node):
    if node is None:
        return inspect.Parameter.empty
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


_KIND = {inspect.Parameter.POSITIONAL_ONLY: "positional", inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
         inspect.Parameter.KEYWORD_ONLY: "keyword_only", inspect.Parameter.VAR_POSITIONAL: "var_positional",
         inspect.Parameter.VAR_KEYWORD: "var_keyword"}


@pytest.mark.skipif(not (UPSTREAM / "verl").is_dir(), reason=f"upstream 0.9.1 source not unpacked at {UPSTREAM}")
@pytest.mark.parametrize("module, qualname", NAMES, ids=[f"{m}:{q}" for m, q in NAMES])
def test_signature_matches_upstream(module, qualname):
    theirs = _upstream_params(_upstream_def(module, qualname))
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    ours = [(p.name, _KIND[p.kind], p.default) for p in inspect.signature(obj).parameters.values()]
    our_named = [p for p in ours if p[1] != "var_keyword"]
    their_named = [p for p in theirs if p[1] != "var_keyword"]
    assert [p[:2] for p in our_named[:len(their_named)]] == [p[:2] for p in their_named], (module, qualname, ours)
    for (name, _, mine), (_, _, upstream) in zip(our_named, their_named):
        if upstream is inspect.Parameter.empty or isinstance(upstream, str) and not isinstance(mine, str):
            continue  # no default, or a default that is an expression (a class, a call): names and order suffice
        assert mine == upstream, f"{module}.{qualname}: default of {name} is {mine!r}, upstream {upstream!r}"
    extra = our_named[len(their_named):]
    assert all(p[2] is not inspect.Parameter.empty for p in extra), f"added parameters need defaults: {extra}"

"""House rules: hardware choices live only in verl/compat, and `import verl.compat` stays light."""
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "verl"
# Dtype, attention kernel, distributed backend and device choices that belong to the compat plan.
FORBIDDEN = re.compile(r"bfloat16|flash_attention_2|flash_attn|\"nccl\"|'nccl'|\.cuda\(\)")


def test_no_hardware_choice_outside_compat():
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if (PACKAGE / "compat") in path.parents:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if FORBIDDEN.search(line):
                hits.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not hits, ("hardware choices outside verl/compat (use the Plan and "
                      "verl.compat.torch_dtype):\n" + "\n".join(hits))


def test_importing_compat_does_not_import_transformers():
    code = "import sys, verl.compat; print('transformers' in sys.modules, 'ray' in sys.modules)"
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=path), timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_compat_imports_without_omegaconf():
    """The benchmark hosts carry torch but not omegaconf: the compat package, the planner and the
    catalog must import there, and build_plan must plan from a plain dict."""
    code = (
        "import sys\n"
        "class NoOmegaconf:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'omegaconf' or name.startswith('omegaconf.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, NoOmegaconf())\n"
        "import verl.compat, verl.compat.planning.planner, verl.compat.device.catalog\n"
        "from verl.compat.planning.model_spec import ModelSpec\n"
        "model = ModelSpec.from_hf_config({'model_type': 'qwen2', 'hidden_size': 64, 'intermediate_size': 128,\n"
        "    'num_hidden_layers': 2, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'vocab_size': 256})\n"
        "config = {'compat': {'device': 't4'}, 'trainer': {'n_gpus_per_node': 1}}\n"
        "plan = verl.compat.build_plan(config, model=model, to_run=False)\n"
        "print(plan.actor.compute_dtype, 'omegaconf' in sys.modules)\n"
    )
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=path), timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["float16", "False"]

"""import_model_code: what a worker imports on a thread while the driver reads the data sets, so that
init_model starts with transformers' model stack loaded (in a fresh interpreter: the test process has
imported it already)."""
import json
import subprocess
import sys

from verl.utils.tiny_model import build_tiny_model_dir

PROBE = """
import sys
from verl.workers.model_building.loading import import_model_code
import_model_code(sys.argv[1])
print({m: m in sys.modules for m in ("transformers.models.auto.modeling_auto",
                                     "transformers.models.qwen2.modeling_qwen2")})
"""


def _imported(path: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, path], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return eval(out.stdout.strip().splitlines()[-1])  # noqa: S307 - our own probe's dict of booleans


def test_a_local_model_gets_its_architecture_module(tmp_path):
    build_tiny_model_dir(str(tmp_path / "m"))
    assert json.loads((tmp_path / "m" / "config.json").read_text())["model_type"] == "qwen2"
    got = _imported(str(tmp_path / "m"))
    assert got["transformers.models.auto.modeling_auto"] and got["transformers.models.qwen2.modeling_qwen2"]


def test_a_hub_id_only_gets_the_auto_classes():
    got = _imported("Qwen/Qwen2.5-0.5B-Instruct")     # nothing is looked up or downloaded for it
    assert got["transformers.models.auto.modeling_auto"] and not got["transformers.models.qwen2.modeling_qwen2"]

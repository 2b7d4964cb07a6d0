"""tests/upstream/api_report.py: its classification of the wheel's modules, its import probe (working module,
stand-in, missing module) and its one-line skip when the wheel cannot be downloaded."""
import importlib.util
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
WHEEL = Path("/tmp/up/verl-0.9.1-py3-none-any.whl")


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("api_report", HERE / "api_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_import_probe_tells_working_modules_stand_ins_and_failures_apart(report):
    got = report.import_here(["verl.utils.hdfs_io", "verl.experimental.fully_async_policy", "verl.no_such_module"], 60)
    assert got["verl.utils.hdfs_io"] == "ok" and got["verl.experimental.fully_async_policy"] == "stand-in"
    assert got["verl.no_such_module"].startswith("ModuleNotFoundError")


def test_classification_reads_each_files_own_imports(report, tmp_path):
    pkg = tmp_path / "verl" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "verl" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from . import uses_vllm\n")
    (pkg / "uses_vllm.py").write_text("def f():\n    import vllm\n")
    (pkg / "plain.py").write_text("import torch\n")
    needs = report.classify(tmp_path)
    assert needs == {"verl": None, "verl.sub": None, "verl.sub.uses_vllm": "vLLM", "verl.sub.plain": None}


def test_unreachable_registry_prints_one_skip_line(report, monkeypatch, capsys):
    monkeypatch.setattr(report, "fetch_wheel", lambda dest: None)
    assert report.main([]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("skipped:")


@pytest.mark.skipif(not WHEEL.is_file(), reason=f"no 0.9.1 wheel at {WHEEL}")
def test_the_wheel_splits_into_74_set_aside_and_292_plain_modules(report, tmp_path):
    needs = report.classify(report.unpack(WHEEL, tmp_path))
    assert len(needs) == 366 and sum(1 for v in needs.values() if v) == 74
    assert needs["verl.utils.reward_score.prime_math"] is None and needs["verl.workers.rollout.vllm_rollout.utils"]

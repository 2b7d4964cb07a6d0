"""The memory model against what the real workers allocated on an H200 (benchmarks/results/memory_*.json).

Each stored case is the plan a profile ran (simulated on the H200 by `compat.device`) and the
allocator's peak per phase that `benchmarks/memory_model.py` measured with the real actor, critic,
reference and rollout workers. Re-predicting those exact plans with today's formulas must keep every
case's peak within the issue's +-15% and no phase under-predicted by more than 3% (an under-prediction
is an OOM the plan did not see), so a formula change that breaks the calibration fails here.

Every file of that form is checked: `{"model": <BUILTIN_MODELS name>, "cases": [{"case", "memory_limit_gb",
"workload": Workload fields, "plan": {"actor", "critic", "ref", "rollout"} (RolePlan / RolloutPlan fields),
"ref_in_actor" (optional), "compiled_layers" (optional: the plan's torch_compile), "model" (optional: this
case's model, over the file's), "model_config" (optional: a config.json's dict instead, e.g. a VL model),
"measured_gb": {phase: GiB}}]}`; new measurements are added as new files.
"""
import json
from pathlib import Path

import pytest

from verl.compat.planning.memory import Workload, estimate_memory
from verl.compat.planning.model_spec import BUILTIN_MODELS, ModelSpec
from verl.compat.plan import RolePlan, RolloutPlan

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
FILES = sorted(RESULTS.glob("memory_*.json"))
CASES = [(path.name, case.get("model", doc.get("model")), case)
         for path in FILES for doc in [json.loads(path.read_text())] for case in doc["cases"]]
PEAK_TOLERANCE = 0.15    # predicted peak vs measured peak
UNDER_TOLERANCE = 0.03   # no phase predicted more than 3% below its measurement


def _model(name: str | None, case: dict) -> ModelSpec:
    import transformers

    if "model_config" in case:
        return ModelSpec.from_hf_config(case["model_config"])
    spec = dict(BUILTIN_MODELS[name])
    model_type = spec.pop("model_type")
    return ModelSpec.from_hf_config(transformers.AutoConfig.for_model(model_type, **spec))


def _predict(model: str, case: dict) -> dict[str, float]:
    role = lambda d: RolePlan(**d) if d else None  # noqa: E731
    plan = case["plan"]
    actor = role(plan["actor"])
    # a LoRA actor with a reference phase and no reference model served it (files may predate the field)
    ref_in_actor = case.get("ref_in_actor", actor.lora_rank > 0 and plan["ref"] is None and "ref" in case["measured_gb"])
    est = estimate_memory(_model(model, case), Workload(**case["workload"]), actor, RolloutPlan(**plan["rollout"]),
                          role(plan["critic"]), role(plan["ref"]), device_memory_gb=case["memory_limit_gb"],
                          ref_in_actor=ref_in_actor, compiled_layers=case.get("compiled_layers", False))
    return {name: phase.total_gb for name, phase in est.phases.items()}


def test_there_are_measurements_to_check():
    assert CASES and all(model in BUILTIN_MODELS or "model_config" in case for _, model, case in CASES)


@pytest.mark.parametrize("file,model,case", CASES, ids=[f"{f}:{c['case']}" for f, _, c in CASES])
def test_peak_within_15_percent_of_the_h200_measurement_and_no_phase_under_by_3(file, model, case):
    predicted, measured = _predict(model, case), case["measured_gb"]
    assert set(measured) <= set(predicted)
    peak_pred, peak_meas = max(predicted[p] for p in measured), max(measured.values())
    assert peak_pred == pytest.approx(peak_meas, rel=PEAK_TOLERANCE), (predicted, measured)
    for phase, gb in measured.items():
        assert predicted[phase] >= (1 - UNDER_TOLERANCE) * gb, (phase, predicted[phase], gb)

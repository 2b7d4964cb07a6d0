"""Step two of compat's flow: the decisions, from (device, config, software, model) to a `Plan`.

`planner.make_plan` is the entry and reads top to bottom; `decider` keeps its reasons and adapted
settings; `settings` is the one reader of user settings; `model_spec` reads a model's sizes from its
config.json; `memory` predicts the peak per phase and `fit` (with `host_memory` and `wrapping`) finds
the smallest change that fits; `throughput`, `lora`, `vision`, `reward_model` and `sft` hold the rules
for their part of the plan; `modes` answers the doctor's "what would each training mode need here".
Everything here is pure: no device is touched, no weights loaded.
"""

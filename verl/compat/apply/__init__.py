"""Step three of compat's flow: carrying a `Plan` out.

`apply_plan` enforces the plan in each worker process and writes its values into the config;
`attention` and `varlen_attention` register the attention kernels the plan may name with
transformers; `numerics` is the half-precision guard run in the workers and `precision` re-issues the
plan when it fails; `device_names` answers "which device type and backend" for code that asks by
function instead of receiving a plan.
"""

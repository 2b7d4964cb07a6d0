"""How the FSDP workers build their model from the plan, before and around sharding.

`loading` (tokenizer, processor and the Hugging Face model in the planned dtype and attention, a
4-bit base, the vision tower frozen), `frozen_weights` (frozen half-precision weights computed in
float32) and `layer_compile` (each decoder layer compiled before FSDP2 shards it). Sharding itself is
upstream's `verl.utils.fsdp_utils`.
"""

"""Save and load one FSDP2 worker's training state as per-rank shards (upstream verl's file names).

    model_world_size_<W>_rank_<R>.pt        this rank's local shard of every parameter and buffer
    optim_world_size_<W>_rank_<R>.pt        the optimizer's state_dict, DTensors as local shards
    extra_state_world_size_<W>_rank_<R>.pt  LR scheduler, grad scaler, RNG states (rollout sampling too)
    huggingface/                             config + tokenizer (and the full weights with `hf_model`)
    fsdp_config.json                         {"FSDP_version": 2, "world_size": W}, read by verl.model_merger
    lora_train_meta.json                     a LoRA model's rank, alpha and task type (verl.utils.lora)

A LoRA model's shards hold every tensor under peft's names, as upstream's do (`base_model.model.` + the
model's name; `.base_layer.` for a frozen weight under an adapter, `.lora_A.default.` / `.lora_B.default.`
for the adapters); its `huggingface/` weights (with `hf_model`) are the merged ones.

Shards are stored as plain local tensors, not DTensors, so a file depends on nothing but the world
size; loading copies each shard into the live (already sharded) parameter, which works the same
with parameters offloaded to host memory. All ranks write into `<path>.partial`; rank 0 renames it
to `<path>` once every rank has finished, so `<path>` only ever holds a complete save. Before writing,
rank 0 checks that the disk has room for every rank's shards; a rank whose write fails (a full disk)
makes all ranks stop, and rank 0 removes `<path>.partial` again.
"""
from __future__ import annotations

import copy
import functools
import json
import os
import shutil

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager, partial_path, prune, publish, step_of
from verl.utils import lora
from verl.utils.checkpoint.disk_space import CheckpointSpaceError, free_bytes, is_disk_full, require_space, with_slack
from verl.utils.checkpoint.plain_state import load_plain, rng_state, set_rng_state

CONTENTS = ("model", "optimizer", "extra", "hf_model")


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _gather(value) -> list:
    """Every rank's `value`, in rank order (just `[value]` without a process group)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, value)
        return out
    return [value]


def _nbytes(value) -> int:
    """Bytes of the tensors in `value` (a DTensor counts its local shard), containers recursively."""
    if isinstance(value, DTensor):
        value = value.to_local()
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _check_contents(contents, key: str) -> set[str]:
    contents = set(contents or ())
    unknown = contents - set(CONTENTS)
    if unknown:
        raise ValueError(f"checkpoint.{key} has unknown items {sorted(unknown)}; allowed: {list(CONTENTS)}")
    return contents


def _local(value):
    """A DTensor's local shard (on the host), any other tensor on the host, containers recursively."""
    if isinstance(value, DTensor):
        return value.to_local().detach().cpu().clone()
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {k: _local(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_local(v) for v in value)
    return value


def _remove_if_empty(folder: str) -> None:
    """Remove a step folder the failed save left empty (its makedirs created it)."""
    try:
        os.rmdir(folder)
    except OSError:
        pass


class FSDPCheckpointManager(BaseCheckpointManager):
    """Checkpoints of one sharded model with its optimizer, LR scheduler and (fp16) grad scaler.

    `checkpoint_config` is the role's `checkpoint` config (save_contents / load_contents; save_lora_only
    keeps only a LoRA model's adapter weights in the model shards, and such a shard loads into the live
    model over its base weights). `processing_class` (upstream's name; `tokenizer=` is accepted too) is
    saved into huggingface/.
    `optimizer_offload` says the optimizer state lives in host memory between updates, so a load
    puts it back there. `sampling_streams` maps a name to an object that owns a random stream of its
    own (the rollout engine's sampling generator) through `get_rng_state()` / `set_rng_state(state)`;
    the worker registers it once the engine exists, and those states travel in the extra state too.
    """

    def __init__(self, model, optimizer=None, lr_scheduler=None, processing_class=None, checkpoint_config=None,
                 scaler=None, device_type: str = "cpu", optimizer_offload: bool = False, tokenizer=None):
        super().__init__(model, optimizer, lr_scheduler, processing_class if processing_class is not None else tokenizer,
                         checkpoint_config)
        self.scaler = scaler
        self.device_type, self.optimizer_offload = device_type, optimizer_offload
        self.sampling_streams: dict = {}
        config = checkpoint_config or {}
        self.save_contents = _check_contents(config.get("save_contents", ["model", "optimizer", "extra"]),
                                             "save_contents")
        self.load_contents = _check_contents(config.get("load_contents", None) or self.save_contents,
                                             "load_contents")
        self.checkpoint_save_contents = [c for c in CONTENTS if c in self.save_contents]
        self.checkpoint_load_contents = [c for c in CONTENTS if c in self.load_contents]

    def _file(self, folder: str, kind: str) -> str:
        rank, world = _rank_world()
        return os.path.join(folder, f"{kind}_world_size_{world}_rank_{rank}.pt")

    # ------------------------------------------------------------------ save

    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0,
                        max_ckpt_to_keep: int | None = None) -> None:
        """Write this rank's shards to `local_path` (all ranks call it). With `max_ckpt_to_keep`, the same
        component of older `global_step_<N>` siblings is pruned down to that many."""
        if hdfs_path is not None:
            raise NotImplementedError("copying checkpoints to HDFS is not supported; set trainer.default_hdfs_dir=null")
        rank, world = _rank_world()
        tmp = partial_path(local_path)
        needed = sum(_gather(self.expected_bytes()))
        problem = None
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # left by a crash in an earlier save
            try:
                require_space(os.path.normpath(local_path), needed)
                os.makedirs(tmp)
            except OSError as err:
                problem = err
        problem = next((p for p in _gather(problem) if p is not None), None)
        if problem is not None:
            raise problem
        try:
            self._write(tmp, global_step, rank, world)
            failure = None
        except Exception as err:  # noqa: BLE001 - every rank learns of it below, so none waits forever
            failure = err
        failures = _gather(None if failure is None else (rank, failure))
        first = next((f for f in failures if f is not None), None)
        if first is not None:
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
                _remove_if_empty(os.path.dirname(os.path.normpath(local_path)))
            failed_rank, err = first
            if is_disk_full(err):
                raise CheckpointSpaceError(local_path, needed, free_bytes(os.path.dirname(tmp)), during=True) from err
            if failure is not None:
                raise failure
            raise RuntimeError(f"rank {failed_rank} failed to save its part of {local_path}: {err!r}") from err
        if rank == 0:
            publish(local_path)
            if max_ckpt_to_keep:
                step_dir, component = os.path.split(os.path.normpath(local_path))
                step_of(step_dir)  # retention counts global_step_<N> siblings: refuse any other layout
                prune(os.path.dirname(step_dir), component, max_ckpt_to_keep)
        _barrier()

    def expected_bytes(self) -> int:
        """About how many bytes this rank's part of a save takes (its shards, plus the full weights on
        rank 0 with `hf_model`), with slack for file headers, config and tokenizer."""
        total = 0
        if "model" in self.save_contents:
            total += _nbytes(self._model_state())
        if "optimizer" in self.save_contents and self.optimizer is not None:
            total += _nbytes(self.optimizer.state_dict()["state"])
        if "hf_model" in self.save_contents and _rank_world()[0] == 0:
            total += sum(p.numel() * p.element_size() for p in self.model.parameters())
        return with_slack(total)

    def _write(self, tmp: str, global_step: int, rank: int, world: int) -> None:
        """This rank's files into `tmp` (rank 0 also the huggingface/ folder and fsdp_config.json). The
        full weights for `hf_model` are gathered first: that collective must not wait on a rank whose
        own write has already failed."""
        full_state = self._full_state()
        if "model" in self.save_contents:
            torch.save(_local(self._model_state()), self._file(tmp, "model"))
        if "optimizer" in self.save_contents and self.optimizer is not None:
            torch.save(_local(self.optimizer.state_dict()), self._file(tmp, "optim"))
        if "extra" in self.save_contents:
            extra = {
                "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "rng": rng_state(self.device_type),
                "sampling_rng": {name: owner.get_rng_state() for name, owner in self.sampling_streams.items()},
                "global_step": global_step,
            }
            torch.save(extra, self._file(tmp, "extra_state"))
        if rank == 0:
            self._save_huggingface(os.path.join(tmp, "huggingface"), full_state)
            with open(os.path.join(tmp, "fsdp_config.json"), "w") as f:
                json.dump({"FSDP_version": 2, "world_size": world}, f, indent=4)
            if lora.has_adapters(self.model):
                lora.write_train_meta(self.model, tmp)

    def _full_state(self):
        """The whole model's weights on every rank's host (a collective), with `hf_model`; else None. A LoRA
        model's are its merged inference weights under the base model's names."""
        if "hf_model" not in self.save_contents:
            return None
        if lora.has_adapters(self.model):
            from verl.utils.fsdp_utils import full_params

            with full_params(self.model):   # every rank gathers; the merged weights are computed whole
                full_state = {name: t.detach().cpu().clone() for name, t in lora.inference_weights(self.model)}
            # one dtype for the folder: the widest (float32 where float32 updates were merged into a half base)
            widest = functools.reduce(torch.promote_types, (t.dtype for t in full_state.values() if t.is_floating_point()))
            return {k: t.to(widest) if t.is_floating_point() else t for k, t in full_state.items()}
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def _save_huggingface(self, folder: str, full_state) -> None:
        """Config and tokenizer always; the full weights when `full_state` was gathered (rank 0 only)."""
        os.makedirs(folder, exist_ok=True)
        config = self.model.config
        if lora.has_adapters(self.model):   # the folder describes (and holds) the dense merged model
            config = copy.deepcopy(config)
            if getattr(config, "quantization_config", None) is not None:
                del config.quantization_config
            if full_state is not None:
                config.dtype = str(next(iter(full_state.values())).dtype).removeprefix("torch.")
        config.save_pretrained(folder)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(folder)
        if full_state is not None and lora.has_adapters(self.model):
            # the merged weights under the base model's names; save_pretrained would describe the adapted
            # (possibly 4-bit) model instead
            from safetensors.torch import save_file

            save_file(full_state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        elif full_state is not None:
            self.model.save_pretrained(folder, state_dict=full_state)

    # ------------------------------------------------------------------ load

    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False):
        """Restore what `load_contents` names from `local_path` (all ranks call it, same world size)."""
        if hdfs_path is not None:
            raise NotImplementedError("loading checkpoints from HDFS is not supported; use a local path")
        if not os.path.isdir(local_path):
            raise FileNotFoundError(f"no checkpoint at {local_path}")
        if "model" in self.load_contents:
            self._load_model(load_plain(self._existing(local_path, "model")))
        if "optimizer" in self.load_contents and self.optimizer is not None:
            self._load_optimizer(load_plain(self._existing(local_path, "optim")))
        if "extra" in self.load_contents:
            extra = load_plain(self._existing(local_path, "extra_state"))
            if self.lr_scheduler is not None and extra.get("lr_scheduler") is not None:
                self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
            if self.scaler is not None and extra.get("scaler"):
                self.scaler.load_state_dict(extra["scaler"])
            if "rng" in extra:
                set_rng_state(extra["rng"], self.device_type)
            saved_streams = extra.get("sampling_rng") or {}
            for name, owner in self.sampling_streams.items():
                owner.set_rng_state(saved_streams.get(name))
        _barrier()
        if del_local_after_load and _rank_world()[0] == 0:
            shutil.rmtree(local_path, ignore_errors=True)

    def _existing(self, folder: str, kind: str) -> str:
        path = self._file(folder, kind)
        if not os.path.exists(path):
            saved = sorted(f for f in os.listdir(folder) if f.startswith(kind + "_world_size_"))
            raise FileNotFoundError(
                f"{path} not found (saved: {saved[:4]}...). Shards are per rank: resume with the world size "
                "the checkpoint was saved with, or leave this item out of checkpoint.load_contents."
            )
        return path

    def _has_lora(self) -> bool:
        """A LoRA model: adapters added by this verl, or a peft model (possibly under an FSDP1-style wrapper)."""
        inner = getattr(self.model, "_fsdp_wrapped_module", self.model)
        return lora.has_adapters(self.model) or hasattr(inner, "peft_config")

    def _model_state(self) -> dict:
        """What the model shard holds: every tensor, or with save_lora_only a LoRA model's adapters alone."""
        state = self._named(self.model.state_dict())
        if not (self.should_save_lora_only and self._has_lora()):
            return state
        adapters = {k: v for k, v in state.items() if self.is_lora_only_state_dict({k: v})}
        if not adapters:
            raise ValueError(f"checkpoint.save_lora_only=True, but none of the model's {len(state)} tensors is a "
                             "LoRA adapter weight (names with 'lora_' or '.adapter_')")
        return adapters

    def _named(self, state: dict) -> dict:
        """The model's state under the names its shards use (peft's, for a LoRA model)."""
        if not lora.has_adapters(self.model):
            return state
        return {lora.STATE_PREFIX + name: value for name, value in state.items()}

    @torch.no_grad()
    def _load_model(self, saved: dict) -> None:
        live = self._named(self.model.state_dict())
        if self.is_lora_only_state_dict(saved):   # save_lora_only: the adapters over the live base weights
            unexpected = sorted(set(saved) - set(live))
            if unexpected:
                raise KeyError(f"the LoRA-only checkpoint has {unexpected[:5]}, which the model lacks: were the "
                               "same adapters (lora_rank, target_modules) configured?")
            live = {name: live[name] for name in saved}
        missing = sorted(set(live) - set(saved))
        if missing:
            raise KeyError(f"the checkpoint lacks {missing[:5]}: it was saved from a different model")
        for name, tensor in live.items():
            target = tensor.to_local() if isinstance(tensor, DTensor) else tensor
            if target.shape != saved[name].shape:
                raise ValueError(f"{name}: checkpoint shard {tuple(saved[name].shape)} != live shard "
                                 f"{tuple(target.shape)}; was it saved with another world size or model?")
            target.copy_(saved[name])

    def _load_optimizer(self, saved: dict) -> None:
        """Local shards become DTensors laid out like their parameters, then the optimizer loads them."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        state = {}
        for index, param_state in saved["state"].items():
            param = params[int(index)]
            state[index] = {
                key: DTensor.from_local(value.to(param.to_local().device), param.device_mesh, param.placements,
                                        shape=param.shape, stride=param.stride(), run_check=False)
                if isinstance(param, DTensor) and isinstance(value, torch.Tensor) and value.dim() > 0 else value
                for key, value in param_state.items()
            }
        self.optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})
        if self.optimizer_offload:
            from verl.utils.fsdp_utils import move_optimizer_state

            move_optimizer_state(self.optimizer, "cpu")

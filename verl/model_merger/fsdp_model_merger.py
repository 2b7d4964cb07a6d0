"""Join this verl's per-rank FSDP2 shards (see verl/utils/checkpoint) into one Hugging Face model.

Each `model_world_size_<W>_rank_<R>.pt` holds rank R's local slice of every parameter as a plain tensor.
FSDP2 splits a parameter along dim 0 in rank order, so the full tensor is the ranks' slices joined along
dim 0; a tensor every rank holds whole (an unsharded buffer) is taken from rank 0. Which case applies is
read off the full shapes of the model that `huggingface/config.json` describes, built on the meta
device (no memory, no random init). Weights keep the dtype they were trained in, so the merged model
gives the checkpoint's logits exactly. A LoRA checkpoint is merged (`lora_merge`): the folder holds the
base weights with the adapters added in, and `lora_adapter/` the adapters alone, as peft loads them.
"""
from __future__ import annotations

import json
import os
import re
import shutil

import torch

from verl.model_merger import lora_merge
from verl.model_merger.base_model_merger import ModelMergerConfig

_SHARD = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")
# files of huggingface/ that are not weights: copied beside the merged weights (tokenizer, generation config)
_WEIGHT_FILE = re.compile(r"\.(safetensors|bin)$|\.index\.json$")


def world_size_of(local_dir: str) -> int:
    """From `fsdp_config.json` (upstream's record) when present, else from the shard file names."""
    record = os.path.join(local_dir, "fsdp_config.json")
    if os.path.isfile(record):
        with open(record) as f:
            return int(json.load(f)["world_size"])
    sizes = {int(m.group(1)) for m in map(_SHARD.match, os.listdir(local_dir)) if m}
    if len(sizes) != 1:
        raise FileNotFoundError(f"{local_dir} should hold model_world_size_<W>_rank_<R>.pt shards of one world size "
                                f"(found sizes {sorted(sizes)}); point --local_dir at global_step_<N>/actor or /critic.")
    return sizes.pop()


def load_shards(local_dir: str) -> list[dict[str, torch.Tensor]]:
    world = world_size_of(local_dir)
    paths = [os.path.join(local_dir, f"model_world_size_{world}_rank_{r}.pt") for r in range(world)]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(f"the checkpoint was saved by {world} ranks but {missing} is missing")
    return [torch.load(p, map_location="cpu", weights_only=True) for p in paths]


def _is_value_model(keys, forced: bool) -> bool:
    """A critic is saved as a token classifier: a `score` head and no `lm_head`."""
    return forced or (any(k.startswith("score.") for k in keys) and not any(k.startswith("lm_head.") for k in keys))


def merge_state_dicts(shards: list[dict[str, torch.Tensor]], full_shapes: dict[str, torch.Size]) -> dict:
    """One full tensor per key: joined along dim 0 where the ranks hold slices, rank 0's where whole."""
    unknown = sorted(set(shards[0]) - set(full_shapes))
    if unknown:
        raise KeyError(f"the shards hold {unknown[:5]}, which the model in huggingface/config.json lacks")
    merged = {}
    for key in shards[0]:
        parts = [shard[key] for shard in shards]
        want = full_shapes[key]
        if all(p.shape == want for p in parts):
            merged[key] = parts[0]
            continue
        joined = torch.cat(parts, dim=0)
        if joined.shape != want:
            raise ValueError(f"{key}: the {len(parts)} shards join to {tuple(joined.shape)}, the model needs "
                             f"{tuple(want)}")
        merged[key] = joined.contiguous()
    return merged


class FSDPModelMerger:
    """`merge_and_save()` writes `target_dir`; under the `test` operation it compares with `test_hf_dir`."""

    def __init__(self, config: ModelMergerConfig):
        self.config = config
        self.adapter = None   # a LoRA checkpoint's adapters (lora_merge.Adapters), once merged_model ran

    def _auto_class(self, value_model: bool, hf_config=None):
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForTokenClassification

        if value_model:
            return AutoModelForTokenClassification
        # a vision-language checkpoint (its processor files travel with the other non-weight files)
        return AutoModelForImageTextToText if getattr(hf_config, "vision_config", None) is not None \
            else AutoModelForCausalLM

    def merged_model(self):
        """The model of huggingface/config.json holding the merged weights (built on meta, then assigned)."""
        from transformers import AutoConfig

        shards = load_shards(self.config.local_dir)
        adapters = None
        if any(".lora_A." in key for key in shards[0]):
            shards, adapters = lora_merge.split_adapters(shards, self.config.local_dir)
        hf_config = AutoConfig.from_pretrained(self.config.hf_model_config_path,
                                               trust_remote_code=self.config.trust_remote_code)
        value_model = _is_value_model(shards[0], self.config.is_value_model)
        if value_model:
            hf_config.num_labels = 1
        if adapters is not None and hasattr(hf_config, "quantization_config"):
            del hf_config.quantization_config   # a QLoRA base: the merged weights are dense
        auto_cls = self._auto_class(value_model, hf_config)
        dtype = next(iter(shards[0].values())).dtype
        with torch.device("meta"):
            model = auto_cls.from_config(hf_config, trust_remote_code=self.config.trust_remote_code, dtype=dtype)
        state = merge_state_dicts(shards, {k: v.shape for k, v in model.state_dict().items()})
        self.adapter = None if adapters is None else adapters.merge_into(state)
        model.load_state_dict(state, strict=False, assign=True)
        still_meta = [n for n, p in model.named_parameters() if p.is_meta]
        if still_meta:
            raise KeyError(f"the checkpoint lacks {still_meta[:5]}: was it saved from a different model?")
        model.tie_weights()
        model.config.architectures = [model.__class__.__name__]
        return model, state

    def merge_and_save(self) -> None:
        if self.config.operation == "test":
            self._compare_with_reference()
            return
        model, state = self.merged_model()
        target = self.config.target_dir
        os.makedirs(target, exist_ok=True)
        source = self.config.hf_model_config_path
        for name in os.listdir(source):
            if not _WEIGHT_FILE.search(name) and name != "config.json" and os.path.isfile(os.path.join(source, name)):
                shutil.copy2(os.path.join(source, name), os.path.join(target, name))
        count = len(state)   # counted first: save_pretrained empties the dict it is given
        model.save_pretrained(target, state_dict=state)
        print(f"verl.model_merger: wrote {type(model).__name__} ({count} tensors) to {target}")
        if self.adapter is not None:
            folder = self.adapter.save(os.path.join(target, lora_merge.ADAPTER_FOLDER))
            print(f"verl.model_merger: wrote the LoRA adapter (merged into the weights above) to {folder}")
        if self.config.hf_upload:
            self._upload(target)

    def _upload(self, folder: str) -> None:
        from huggingface_hub import HfApi

        api = HfApi()
        api.create_repo(self.config.hf_upload_path, private=self.config.private, exist_ok=True)
        api.upload_folder(folder_path=folder, repo_id=self.config.hf_upload_path, repo_type="model")

    def _compare_with_reference(self) -> None:
        """Every reference weight must be in the checkpoint with the same shape and values (dtype-aware)."""
        _, state = self.merged_model()
        reference_model = self._auto_class(_is_value_model(state, self.config.is_value_model)).from_pretrained(
            self.config.test_hf_dir, trust_remote_code=self.config.trust_remote_code)
        reference = reference_model.state_dict()
        tied = {"lm_head.weight"} if reference_model.config.tie_word_embeddings else set()
        missing = sorted(set(reference) - set(state) - tied)
        if missing:
            raise KeyError(f"{missing[:5]} are in {self.config.test_hf_dir} but not in the checkpoint")
        for key in set(reference) & set(state):
            torch.testing.assert_close(state[key].to(reference[key].dtype), reference[key],
                                       msg=lambda m, k=key: f"{k}: {m}")
        print(f"verl.model_merger: the checkpoint matches {self.config.test_hf_dir} ({len(reference)} tensors)")

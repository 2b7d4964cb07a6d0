"""Prompts for RL: chat-formatted, tokenised and left-padded to `data.max_prompt_length`.

Rows are kept in one Arrow table and turned into Python objects one at a time, so a large data set costs
its compact columnar size in host memory rather than a Python object per cell (the field report's host
ran out of memory on the latter).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset, RandomSampler, SequentialSampler

from verl.utils.dataset import length_cache
from verl.utils.torch_functional import compute_position_id_with_mask, postprocess_data

TRUNCATION_MODES = ("error", "left", "right", "middle")
_LENGTH_BATCH = 1024  # prompts tokenised per call when measuring lengths for the over-long filter


def collate_fn(data_list: list[dict]) -> dict:
    """Batch samples: tensors are stacked; everything else becomes a 1-D numpy object array.

    Object arrays keep each sample's value whole (a list of token ids stays one element), which is what
    DataProto's non-tensor batch expects.
    """
    batch = {}
    for key in data_list[0]:
        values = [sample[key] for sample in data_list]
        if isinstance(values[0], torch.Tensor):
            batch[key] = torch.stack(values)
        else:
            column = np.empty(len(values), dtype=object)
            for i, value in enumerate(values):
                column[i] = value
            batch[key] = column
    return batch


def _read_file(path: str) -> pa.Table:
    """One data file as an Arrow table; errors name the file."""
    full = os.path.expanduser(path)
    if not os.path.isfile(full):
        raise FileNotFoundError(f"data file not found: {path} (check data.train_files / data.val_files)")
    try:
        if full.endswith(".parquet"):
            return pq.read_table(full)
        if full.endswith(".jsonl"):
            return pa_json.read_json(full)
        if full.endswith(".json"):
            with open(full) as handle:
                records = json.load(handle)
            if not isinstance(records, list):
                raise ValueError("a .json data file must hold a list of row objects (or use .jsonl, one per line)")
            return pa.Table.from_pylist(records)
    except (OSError, ValueError, pa.ArrowException) as err:
        raise ValueError(f"could not read data file {path}: {err}") from err
    raise ValueError(f"unsupported data file {path}: use .parquet, .jsonl or .json")


class RLHFDataset(Dataset):
    """Prompt rows from parquet/json(l) files, as upstream verl's RLHFDataset returns them.

    `config` is the `data` section: prompt_key, max_prompt_length, truncation, filter_overlong_prompts,
    return_raw_chat, return_full_prompt, apply_chat_template_kwargs, shuffle/seed (for max_samples).
    """

    def __init__(self, data_files, tokenizer, config, processor=None, max_samples: int = -1):
        self.processor = processor
        self.image_key = config.get("image_key", "images")
        if processor is not None and not config.get("return_multi_modal_inputs", True):
            raise NotImplementedError(
                "data.return_multi_modal_inputs=False (pixels recomputed in the workers, upstream's agent loop) "
                "is not built: the workers read each row's pixel inputs from the batch; set it True"
            )
        if processor is not None and getattr(processor, "rope_index", None) is None:
            raise ValueError(
                f"{type(processor).__name__} came without the model's multimodal position ids; load it with "
                "verl.workers.model_building.loading.load_processor(model path)"
            )
        self.data_files = [data_files] if isinstance(data_files, str) else [str(f) for f in data_files]
        self.tokenizer = tokenizer
        self.config = config
        self.prompt_key = config.get("prompt_key", "prompt")
        self.max_prompt_length = config.get("max_prompt_length", 1024)
        self.truncation = config.get("truncation", "error")
        self.filter_overlong_prompts = config.get("filter_overlong_prompts", True)
        self.return_raw_chat = config.get("return_raw_chat", False)
        self.return_full_prompt = config.get("return_full_prompt", False)
        self.apply_chat_template_kwargs = dict(config.get("apply_chat_template_kwargs") or {})
        if self.truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation={self.truncation!r}; choose one of {TRUNCATION_MODES}")
        if getattr(processor or tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template; prompts are chat "
                "messages, so the tokenizer needs one (set tokenizer.chat_template, or use an instruct model's)"
            )
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_token_id is None:
            raise ValueError("tokenizer has neither a pad token nor an EOS token to left-pad prompts with")

        self._load(config, max_samples)

    # ------------------------------------------------------------------ loading

    def _load(self, config, max_samples: int) -> None:
        tables, origins = [], []
        for file_number, path in enumerate(self.data_files):
            table = _read_file(path)
            if self.prompt_key not in table.column_names:
                raise KeyError(
                    f"data file {path} has no column {self.prompt_key!r} (data.prompt_key); "
                    f"its columns are {table.column_names}"
                )
            tables.append(table)
            origins.append(np.stack([np.full(table.num_rows, file_number), np.arange(table.num_rows)], axis=1))
        try:
            self.table = pa.concat_tables(tables, promote_options="permissive")
        except pa.ArrowException as err:
            raise ValueError(f"data files {self.data_files} have incompatible columns: {err}") from err
        self._origin = np.concatenate(origins)  # (file number, row within that file) of every row
        total = self.table.num_rows
        notes = []

        if 0 < max_samples < total:
            notes.append(f"{'a random' if config.get('shuffle', False) else 'the first'} {max_samples} kept "
                         "(data.train_max_samples / val_max_samples)")
            if config.get("shuffle", False):
                keep = np.random.default_rng(config.get("seed")).choice(total, size=max_samples, replace=False)
            else:
                keep = np.arange(max_samples)
            self._select(keep)
        if self.processor is not None:
            self.check_images()
        if self.filter_overlong_prompts:
            kept = len(self)
            self._select(np.flatnonzero(self._prompt_lengths() <= self.max_prompt_length))
            notes.append(f"{kept - len(self)} prompts over {self.max_prompt_length} tokens dropped")
        print(f"RLHFDataset: {len(self)} of {total} rows from {self.data_files}"
              + (f" ({'; '.join(notes)})" if notes else ""))

    def check_prompt_lengths(self) -> None:
        """Raise if a prompt is over data.max_prompt_length while neither filtering nor truncation is on.

        Such a prompt would stop training at the batch that holds it (and again after a resume); the
        driver calls this before training starts, so they are all found at once instead.
        """
        if self.filter_overlong_prompts or self.truncation != "error":
            return
        lengths = self._prompt_lengths()
        over = np.flatnonzero(lengths > self.max_prompt_length)
        if len(over):
            where = "; ".join(f"{self._where(i)} ({lengths[i]} tokens)" for i in over[:3])
            raise ValueError(
                f"{len(over)} prompt(s) are over data.max_prompt_length={self.max_prompt_length}: {where}"
                f"{' ...' if len(over) > 3 else ''}. Set data.filter_overlong_prompts=True to drop them, "
                "data.truncation=left/right/middle to cut them, or raise data.max_prompt_length."
            )

    def check_images(self) -> None:
        """Raise, naming the row, if a row's `<image>` placeholders and its images disagree in number or
        an image does not decode: found here, before training, rather than at the batch that holds it."""
        has_images = self.image_key in self.table.column_names
        prompts = self.table.column(self.prompt_key)
        images = self.table.column(self.image_key) if has_images else None
        for start in range(0, len(self), _LENGTH_BATCH):
            chunk = prompts.slice(start, _LENGTH_BATCH).to_pylist()
            cells = images.slice(start, _LENGTH_BATCH).to_pylist() if has_images else [None] * len(chunk)
            for offset, (messages, cell) in enumerate(zip(chunk, cells)):
                self._row_images(messages, cell, start + offset)

    def _row_images(self, messages, cell, index: int) -> list:
        """The row's images decoded, after checking they match its placeholders."""
        from verl.utils.dataset.vision_utils import count_placeholders, load_image

        where = self._where(index)
        self._check_messages(messages, index)
        cell = list(cell or [])
        wanted = count_placeholders(messages)
        if wanted != len(cell):
            column = f"column {self.image_key!r} (data.image_key)"
            raise ValueError(f"{where}: the prompt has {wanted} <image> placeholder(s) but {column} holds "
                             f"{len(cell)} image(s); give each <image> one image")
        return [load_image(value, where) for value in cell]

    def _select(self, indices: np.ndarray) -> None:
        self.table = self.table.take(pa.array(indices, type=pa.int64()))
        self._origin = self._origin[indices]

    def _where(self, index: int) -> str:
        file_number, row = self._origin[index]
        return f"row {row} of {self.data_files[file_number]}"

    def _check_messages(self, messages, index: int) -> None:
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise TypeError(
                f"{self._where(index)}: column {self.prompt_key!r} must be a list of {{'role', 'content'}} "
                f"messages, got {type(messages).__name__}: {str(messages)[:200]}"
            )

    def _render(self, messages, index: int, num_images: int = 0) -> str:
        """The chat-formatted prompt text, ending where the assistant's answer starts. With a processor,
        each `<image>` becomes an image part that its chat template expands."""
        self._check_messages(messages, index)
        if self.processor is not None:
            from verl.utils.dataset.vision_utils import structured_messages

            messages = structured_messages(messages, num_images, self._where(index))
            return self.processor.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **self.apply_chat_template_kwargs
            )
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **self.apply_chat_template_kwargs
        )

    def _encode(self, messages, images: list, index: int) -> dict:
        """The processor's output for one row: input_ids (1, seq) with image tokens expanded, and with
        images pixel_values, image_grid_thw and mm_token_type_ids."""
        text = self._render(messages, index, len(images))
        if not images:
            return {"text": text, **self.processor(text=[text], return_tensors="pt")}
        return {"text": text, **self.processor(text=[text], images=images, return_tensors="pt")}

    def _prompt_lengths(self) -> np.ndarray:
        """Token count of every chat-formatted prompt, tokenised in batches (the fast tokenizer is threaded), or
        read from an earlier run's counts over the same files, rows, tokenizer and template (`length_cache`).

        Only the counts are needed, so a fast tokenizer's Rust backend is called directly: the same
        encoding `__getitem__` makes, without building Python lists of every prompt's ids."""
        lengths = np.empty(len(self), dtype=np.int64)
        prompts = self.table.column(self.prompt_key)
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if self.processor is not None:  # image tokens count: each row goes through the processor
            has_images = self.image_key in self.table.column_names
            for index in range(len(self)):
                messages = prompts.slice(index, 1).to_pylist()[0]
                cell = self.table.column(self.image_key).slice(index, 1).to_pylist()[0] if has_images else None
                lengths[index] = self._encode(messages, self._row_images(messages, cell, index), index)[
                    "input_ids"].shape[-1]
            return lengths
        key = length_cache.lengths_key(self.data_files, self._origin, self.prompt_key, self.tokenizer,
                                       self.apply_chat_template_kwargs)
        cached = length_cache.load(key, len(self)) if key else None
        if cached is not None:
            return cached
        for start in range(0, len(self), _LENGTH_BATCH):
            chunk = prompts.slice(start, _LENGTH_BATCH).to_pylist()
            texts = [self._render(messages, start + offset) for offset, messages in enumerate(chunk)]
            if backend is not None:
                counts = [len(encoding.ids) for encoding in backend.encode_batch(texts, add_special_tokens=False)]
            else:
                counts = [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]
            lengths[start : start + len(chunk)] = counts
        if key:
            length_cache.store(key, lengths)
        return lengths

    # ------------------------------------------------------------------ samples

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, index: int) -> dict:
        row = self.table.slice(index, 1).to_pylist()[0]
        messages = row.pop(self.prompt_key)
        if self.processor is not None:
            images = self._row_images(messages, row.pop(self.image_key, None), index)
            encoded = self._encode(messages, images, index)
            text, ids = encoded["text"], encoded["input_ids"]
        else:
            text = self._render(messages, index)
            ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        if ids.shape[-1] > self.max_prompt_length and self.truncation == "error":
            raise ValueError(
                f"{self._where(index)}: the prompt is {ids.shape[-1]} tokens, over data.max_prompt_length="
                f"{self.max_prompt_length}. Set data.filter_overlong_prompts=True to drop such rows, "
                "data.truncation=left/right/middle to cut them, or raise data.max_prompt_length."
            )
        input_ids, attention_mask = postprocess_data(
            ids,
            torch.ones_like(ids),
            max_length=self.max_prompt_length,
            pad_token_id=self.pad_token_id,
            left_pad=True,
            truncation=self.truncation,
        )
        row["input_ids"] = input_ids[0]
        row["attention_mask"] = attention_mask[0]
        row["position_ids"] = compute_position_id_with_mask(attention_mask)[0]
        # The prompt as the rollout engine sees it: the kept tokens, without padding.
        row["raw_prompt_ids"] = input_ids[0][attention_mask[0].bool()].tolist()
        if self.processor is not None:
            self._add_multi_modal(row, encoded, images, input_ids[0], attention_mask[0], index)
        if self.return_raw_chat:
            row["raw_prompt"] = messages
        if self.return_full_prompt:
            row["full_prompts"] = text

        extra_info = row.get("extra_info") or {}
        row["extra_info"] = extra_info
        row["index"] = extra_info.get("index", 0)
        # Multi-turn tool/interaction settings travel with the sample, as upstream's batches carry them.
        row["tools_kwargs"] = extra_info.get("tools_kwargs") or {}
        row["interaction_kwargs"] = extra_info.get("interaction_kwargs") or {}
        return row


    def _add_multi_modal(self, row: dict, encoded: dict, images: list, input_ids, attention_mask, index) -> None:
        """A VL row's extras, under upstream's names: `multi_modal_data` (the images, for vLLM),
        `multi_modal_inputs` (the processor's pixel tensors, for the model's forward) and (4, seq)
        position ids (text, then the mrope axes over the image grid)."""
        image_token_id = self.processor.image_token_id
        image_tokens = input_ids == image_token_id
        if int(image_tokens.sum()) != int((encoded["input_ids"] == image_token_id).sum()):
            raise ValueError(f"{self._where(index)}: data.truncation cut into the image tokens; raise "
                             "data.max_prompt_length or set data.truncation=error")
        token_types = image_tokens.long()
        grid = encoded.get("image_grid_thw")
        row["position_ids"] = self.processor.rope_index(input_ids, attention_mask, token_types, grid)
        row["multi_modal_data"] = {"image": images}
        # vLLM widens each image span itself: it gets the prompt as rendered, one image pad per image (upstream's).
        row["raw_prompt_ids"] = self.tokenizer(encoded["text"], add_special_tokens=False)["input_ids"]
        row["multi_modal_inputs"] = {k: encoded[k] for k in ("pixel_values", "image_grid_thw") if k in encoded}


def create_rl_dataset(data_paths, data_config, tokenizer, processor=None, is_train: bool = True, max_samples=None):
    """The train or validation data set; `max_samples` defaults to data.train_max_samples / val_max_samples."""
    if max_samples is None:
        max_samples = data_config.get("train_max_samples" if is_train else "val_max_samples", -1)
        max_samples = -1 if max_samples is None else max_samples
    paths = [data_paths] if isinstance(data_paths, str) else list(data_paths)
    return _dataset_class(data_config)(
        data_files=paths, tokenizer=tokenizer, config=data_config, processor=processor, max_samples=max_samples
    )


def _dataset_class(data_config) -> type:
    """RLHFDataset, or the user's class from data.custom_cls.path / .name."""
    custom = data_config.get("custom_cls") or {}
    if not custom.get("path"):
        return RLHFDataset
    from verl.utils.import_utils import load_object_from_file

    cls = load_object_from_file(custom["path"], custom.get("name"), "data.custom_cls")
    if not (isinstance(cls, type) and issubclass(cls, Dataset)):
        raise TypeError(f"data.custom_cls.name={custom.get('name')!r} must be a torch.utils.data.Dataset subclass")
    return cls


def create_rl_sampler(data_config, dataset: Sequence) -> torch.utils.data.Sampler:
    """The user's sampler from data.sampler.class_path / class_name, else shuffled (seeded by data.seed)
    when data.shuffle, else in file order."""
    custom = data_config.get("sampler") or {}
    if custom.get("class_path"):
        from verl.utils.import_utils import load_object_from_file

        cls = load_object_from_file(custom["class_path"], custom.get("class_name"), "data.sampler")
        if not (isinstance(cls, type) and issubclass(cls, torch.utils.data.Sampler)):
            raise TypeError(f"data.sampler.class_name={custom.get('class_name')!r} is not a torch.utils.data.Sampler "
                            "subclass")
        return cls(data_source=dataset, data_config=data_config)
    if not data_config.get("shuffle", True):
        return SequentialSampler(dataset)
    generator = torch.Generator()  # without data.seed: torch's fixed default seed, so runs still repeat
    seed = data_config.get("seed")
    if seed is not None:
        generator.manual_seed(seed)
    return RandomSampler(dataset, generator=generator)

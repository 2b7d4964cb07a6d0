"""Images in prompt rows: decoding them, placing them in chat messages, and a VL model's position ids.

Rows follow upstream's layout: the prompt's text holds one `<image>` placeholder per image and the
`data.image_key` column (default `images`) holds the images in order, each as `{"bytes": ..., "path": ...}`
(how parquet stores a `datasets.Image`), a file path or a PIL image.
"""
from __future__ import annotations

import io
import re

import torch

IMAGE_PLACEHOLDER = "<image>"


def count_placeholders(messages) -> int:
    """How many `<image>` placeholders the messages' text holds."""
    return sum(m["content"].count(IMAGE_PLACEHOLDER) for m in messages
               if isinstance(m, dict) and isinstance(m.get("content"), str))


def load_image(value, where: str):
    """One image cell as an RGB PIL image; `where` (the row) is named in every error."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, Image.Image):
        return value.convert("RGB")
    if isinstance(value, dict) and value.get("image") is not None and not value.get("bytes"):
        return load_image(value["image"], where)
    try:
        if isinstance(value, dict) and value.get("bytes"):
            image = Image.open(io.BytesIO(value["bytes"]))
        elif isinstance(value, dict) and value.get("path"):
            image = Image.open(value["path"])
        elif isinstance(value, str):
            image = Image.open(value)
        else:
            raise ValueError(f"expected {{'bytes', 'path'}}, a file path or a PIL image, got {type(value).__name__}")
        image.load()
    except (OSError, UnidentifiedImageError, ValueError) as err:
        raise ValueError(f"{where}: unreadable image ({type(err).__name__}: {err})") from err
    return image.convert("RGB")


def structured_messages(messages, num_images: int, where: str) -> list[dict]:
    """The messages with each `<image>` turned into an image part, for a processor's chat template.

    The count of placeholders must equal `num_images`: a prompt that asks for an image the row lacks
    (or an image no prompt refers to) is an error naming the row.
    """
    wanted = count_placeholders(messages)
    if wanted != num_images:
        raise ValueError(f"{where}: the prompt has {wanted} {IMAGE_PLACEHOLDER} placeholder(s) but the row holds "
                         f"{num_images} image(s); each {IMAGE_PLACEHOLDER} needs one image in the data.image_key column")
    out = []
    for message in messages:
        content = message["content"]
        if isinstance(content, str) and IMAGE_PLACEHOLDER in content:
            parts = []
            for piece in re.split(f"({re.escape(IMAGE_PLACEHOLDER)})", content):
                if piece == IMAGE_PLACEHOLDER:
                    parts.append({"type": "image"})
                elif piece:
                    parts.append({"type": "text", "text": piece})
            message = {**message, "content": parts}
        out.append(message)
    return out


class RopeIndex:
    """A VL model's multimodal rotary positions from its config, without the model's weights.

    It calls the model class's own `get_rope_index` (transformers' Qwen2/2.5-VL), which reads only the
    config and a helper of the class. `__call__` returns upstream's layout: (4, seq) per row, the text
    positions (0, 1, ... over real tokens) first, then the (temporal, height, width) mrope axes.
    """

    def __init__(self, model_class, config):
        import inspect

        self._cls = model_class
        self.config = config
        # transformers 5 tells image tokens apart by `mm_token_type_ids`; 4.x finds them by the config's ids
        self._types = "mm_token_type_ids" in inspect.signature(model_class.get_rope_index).parameters

    def get_vision_position_ids(self, *args, **kwargs):
        return self._cls.get_vision_position_ids(self, *args, **kwargs)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, mm_token_type_ids: torch.Tensor,
                 image_grid_thw: torch.Tensor | None) -> torch.Tensor:
        """For one row: input_ids, attention_mask, mm_token_type_ids (seq,) -> position ids (4, seq)."""
        types = {"mm_token_type_ids": mm_token_type_ids[None]} if self._types else {}
        mrope, _ = self._cls.get_rope_index(self, input_ids[None], image_grid_thw=image_grid_thw,
                                            attention_mask=attention_mask[None], **types)
        text = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        return torch.cat([text[None], mrope[:, 0]], dim=0)


def rope_index_for(name_or_path, **kwargs) -> RopeIndex | None:
    """The RopeIndex of the model at `name_or_path`, or None when its class has no multimodal positions."""
    import transformers
    from transformers.models.auto import modeling_auto

    config = transformers.AutoConfig.from_pretrained(name_or_path, **kwargs)
    name = modeling_auto.MODEL_MAPPING_NAMES.get(config.model_type)
    model_class = getattr(transformers, name, None) if name else None
    if model_class is None or not hasattr(model_class, "get_rope_index"):
        return None
    return RopeIndex(model_class, config)


def concat_multi_modal_inputs(rows) -> dict:
    """One forward's multimodal inputs from per-row dicts: each key's tensors joined along dim 0
    (pixel patches and grid rows follow the rows' image tokens in order). Rows without images add nothing."""
    rows = [r for r in rows if r]
    if not rows:
        return {}
    return {key: torch.cat([r[key] for r in rows if key in r], dim=0) for key in rows[0]}

"""What a reward model reads: a checked model folder, and each rollout turned into the reward model's
own tokens.

Like upstream 0.9.1, a response is decoded with the policy's tokenizer and, together with the prompt's
chat messages (`raw_prompt`, kept when `data.return_raw_chat=True`), re-templated with the reward
model's chat template, so a reward model with another tokenizer scores the conversation as it was
trained to read it. Without the chat messages the policy's own tokens are scored, which only works
when the reward model shares the policy's vocabulary.
"""
from __future__ import annotations

import json
import os

import torch

CLASSIFIER_SUFFIX = "ForSequenceClassification"


def classification_head_problem(path: str, key: str) -> str | None:
    """Why the model folder at `path` (named by config key `key`) cannot be a reward model, or None.

    A causal LM would load into AutoModelForSequenceClassification with a randomly drawn score head
    and train the policy on noise, so the folder's config.json must name a sequence classifier with
    one label (the score).
    """
    from verl.utils.fs import resolve_model_path

    try:
        config_file = resolve_model_path(path, "config.json")
    except (OSError, ValueError) as err:
        return f"{key}={path}: {err}"
    if not os.path.isfile(config_file):
        return f"{key}={path}: no config.json there; point it at a Hugging Face model folder"
    with open(config_file) as f:
        config = json.load(f)
    architectures = config.get("architectures") or []
    if not any(str(a).endswith(CLASSIFIER_SUFFIX) for a in architectures):
        return (f"{key}={path}: its config.json names {architectures or 'no architectures'}, not a sequence "
                f"classifier (an *{CLASSIFIER_SUFFIX} with a score head); a reward model needs a classification "
                "head, e.g. a checkpoint saved from AutoModelForSequenceClassification with num_labels=1")
    labels = int(config.get("num_labels") or len(config.get("id2label") or {}) or 1)
    if labels != 1:
        return (f"{key}={path}: the classifier has {labels} labels; a reward model gives one score per "
                "response (num_labels=1)")
    return None


def same_vocabulary(a, b) -> bool:
    return a is b or a.get_vocab() == b.get_vocab()


def reward_model_token_ids(data, input_tokenizer, rm_tokenizer, max_length: int) -> tuple[list[list[int]], int]:
    """The reward model's input ids per row of `data` (a DataProto with prompts, responses and
    attention_mask) and how many rows were cut to `max_length` (from the left: the score is read at
    the end)."""
    prompts, responses = data.batch["prompts"], data.batch["responses"]
    prompt_len = prompts.shape[-1]
    mask = data.batch["attention_mask"]
    response_valid = mask[:, prompt_len:].sum(-1).tolist()
    chats = data.non_tensor_batch.get("raw_prompt")
    if chats is None and not same_vocabulary(input_tokenizer, rm_tokenizer):
        raise ValueError("the reward model's tokenizer differs from the policy's, so the conversation must be "
                         "re-templated for it from the prompt's chat messages: set data.return_raw_chat=True")
    rows, cut = [], 0
    for i in range(len(data)):
        response = responses[i, : response_valid[i]]
        if chats is None:
            ids = prompts[i][mask[i, :prompt_len].bool()].tolist() + response.tolist()
        else:
            text = input_tokenizer.decode(response, skip_special_tokens=True)
            chat = [dict(m) for m in chats[i]] + [{"role": "assistant", "content": text}]
            rendered = rm_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)
            ids = rm_tokenizer(rendered, add_special_tokens=False)["input_ids"]
        if len(ids) > max_length:
            ids, cut = ids[-max_length:], cut + 1
        rows.append(ids)
    return rows, cut


def left_padded(rows: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask and position_ids of `rows` padded on the left, so every row's last
    token is in the last column, where the score is read."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = 1
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids}


def scores_at_last_token(scores: torch.Tensor, data) -> torch.Tensor:
    """`rm_scores`: one score per row, placed at the row's last response token (zeros elsewhere), as
    rule rewards are."""
    responses = data.batch["responses"]
    prompt_len = data.batch["prompts"].shape[-1]
    valid = data.batch["attention_mask"][:, prompt_len:].sum(-1)
    out = torch.zeros(responses.shape, dtype=torch.float32)
    out[torch.arange(len(out)), (valid - 1).clamp(min=0)] = scores.float().cpu()
    return out

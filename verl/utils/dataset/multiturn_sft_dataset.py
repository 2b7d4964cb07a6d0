"""SFT conversations: rows of chat messages, trained on every assistant turn (upstream's module path).

A row's `data.messages_key` column holds a list of {"role", "content"} messages; a single-turn row is
one user and one assistant message. The conversation is rendered with the tokenizer's chat template
one prefix at a time, so each message owns exactly the tokens its turn adds; the loss mask covers an
assistant message's tokens except the generation prompt that introduces it ("<|im_start|>assistant\\n"),
which the model is given at generation time rather than asked to write.
"""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset

TRUNCATION_MODES = ("error", "left", "right")


class MultiTurnSFTDataset(Dataset):
    """Upstream 0.9.1's constructor: (parquet_files, tokenizer, config=data section, processor, max_samples).

    Each item: input_ids, attention_mask, position_ids and loss_mask (1 where the token is trained on,
    aligned with input_ids), right-padded to the longest row of a batch by `collate_sft`.
    """

    def __init__(self, parquet_files, tokenizer, config=None, processor=None, max_samples: int = -1):
        if processor is not None:
            raise NotImplementedError("multimodal SFT (a processor) is not supported by this build; use text-only data")
        config = config or {}
        files = [parquet_files] if isinstance(parquet_files, str) else [str(f) for f in parquet_files]
        self.tokenizer = tokenizer
        self.messages_key = config.get("messages_key", "messages")
        self.max_length = int(config.get("max_length", 1024))
        self.truncation = config.get("truncation", "error")
        self.apply_chat_template_kwargs = dict(config.get("apply_chat_template_kwargs") or {})
        if self.truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation={self.truncation!r}; SFT supports {TRUNCATION_MODES}")
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template; SFT conversations are rendered with it "
                             "(set model.custom_chat_template or use an instruct model's tokenizer)")
        frames = []
        for path in files:
            frame = pd.read_parquet(os.path.expanduser(path))
            if self.messages_key not in frame.columns:
                raise KeyError(f"SFT data file {path} has no column {self.messages_key!r} (data.messages_key); "
                               f"its columns are {list(frame.columns)}")
            frames.append(frame)
        table = pd.concat(frames, ignore_index=True)
        if max_samples is not None and 0 < int(max_samples) < len(table):
            table = table.iloc[: int(max_samples)]
        self.conversations = [self._messages(m, i) for i, m in enumerate(table[self.messages_key].tolist())]

    def _messages(self, value, index: int) -> list[dict]:
        messages = list(value) if isinstance(value, (list, tuple, np.ndarray)) else None
        if not messages or not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
            raise TypeError(f"SFT row {index}: column {self.messages_key!r} must be a non-empty list of "
                            f"{{'role', 'content'}} messages, got {str(value)[:200]}")
        if not any(m["role"] == "assistant" for m in messages):
            raise ValueError(f"SFT row {index} has no assistant message: nothing to train on")
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]

    def __len__(self) -> int:
        return len(self.conversations)

    def _render(self, messages: list[dict], generation_prompt: bool = False) -> str:
        if not messages:
            return ""
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                                  **self.apply_chat_template_kwargs)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def tokens(self, index: int) -> tuple[list[int], list[int]]:
        """(input ids, loss mask) of conversation `index`, before truncation."""
        messages = self.conversations[index]
        ids, mask, done = [], [], ""
        for turn, message in enumerate(messages):
            upto = self._render(messages[: turn + 1])
            if not upto.startswith(done):
                raise ValueError(f"SFT row {index}: the chat template renders message {turn} by rewriting the "
                                 "earlier ones, so its tokens cannot be told apart; use a template whose "
                                 "rendering of a conversation extends that of its prefix")
            if message["role"] == "assistant":
                opened = self._render(messages[:turn], generation_prompt=True)
                header = opened[len(done):] if opened.startswith(done) and upto.startswith(opened) else ""
                head, body = self._encode(header), self._encode(upto[len(done) + len(header):])
                ids += head + body
                mask += [0] * len(head) + [1] * len(body)
            else:
                piece = self._encode(upto[len(done):])
                ids += piece
                mask += [0] * len(piece)
            done = upto
        return ids, mask

    def overlong_rows(self) -> list[tuple[int, int]]:
        """(row, tokens) of every conversation over `data.max_length` when `data.truncation=error`, found
        before training rather than when a batch (or the validation after hours of training) reaches it.
        The whole conversation is encoded in one batched call first; only rows near the limit get the
        exact per-turn encoding `__getitem__` uses (it can differ by a token at each message boundary)."""
        if self.truncation != "error" or not self.conversations:
            return []
        whole = self.tokenizer([self._render(m) for m in self.conversations], add_special_tokens=False)["input_ids"]
        out = []
        for index, ids in enumerate(whole):
            if len(ids) > self.max_length - 4 * len(self.conversations[index]):
                length = len(self.tokens(index)[0])
                if length > self.max_length:
                    out.append((index, length))
        return out

    def __getitem__(self, index: int) -> dict:
        ids, mask = self.tokens(index)
        if len(ids) > self.max_length:
            if self.truncation == "error":
                raise ValueError(f"SFT row {index} is {len(ids)} tokens, over data.max_length={self.max_length}; "
                                 "raise data.max_length or set data.truncation=left/right")
            keep = slice(-self.max_length, None) if self.truncation == "left" else slice(0, self.max_length)
            ids, mask = ids[keep], mask[keep]
        return {"input_ids": torch.tensor(ids, dtype=torch.long), "loss_mask": torch.tensor(mask, dtype=torch.long)}


def collate_sft(rows: list[dict], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of items to their longest: input_ids, attention_mask, position_ids, loss_mask."""
    width = max(len(r["input_ids"]) for r in rows)
    out = {"input_ids": torch.full((len(rows), width), pad_token_id, dtype=torch.long),
           "attention_mask": torch.zeros((len(rows), width), dtype=torch.long),
           "loss_mask": torch.zeros((len(rows), width), dtype=torch.long)}
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        out["input_ids"][i, :n] = row["input_ids"]
        out["attention_mask"][i, :n] = 1
        out["loss_mask"][i, :n] = row["loss_mask"]
    out["position_ids"] = (out["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    return out

"""What every reward manager reads from a rollout batch: the decoded texts and the dataset columns."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DecodedBatch:
    prompts: list[str]
    responses: list[str]
    response_lengths: list[int]
    data_sources: list
    ground_truths: list
    extra_infos: list[dict]


def decode_batch(data, tokenizer, reward_fn_key: str, strip_eos: bool = False) -> DecodedBatch:
    """Decode the valid (unpadded) prompt and response of every row; read the label and data source."""
    prompts, responses = data.batch["prompts"], data.batch["responses"]
    width = prompts.shape[-1]
    mask = data.batch["attention_mask"]
    prompt_lengths = mask[:, :width].sum(-1).tolist()
    response_lengths = mask[:, width:].sum(-1).tolist()
    columns = data.non_tensor_batch
    for key in (reward_fn_key, "reward_model"):
        if key not in columns:
            raise KeyError(f"the batch has no {key!r} column (has {sorted(columns)}); the reward manager reads the "
                           f"data source from data.reward_fn_key={reward_fn_key!r} and the label from "
                           "reward_model['ground_truth'] - check the columns of your data files")
    extras = columns.get("extra_info")
    out = DecodedBatch([], [], [int(n) for n in response_lengths], list(columns[reward_fn_key]), [], [])
    eos = getattr(tokenizer, "eos_token", None)
    for i in range(len(data)):
        out.prompts.append(tokenizer.decode(prompts[i, width - prompt_lengths[i]:], skip_special_tokens=True))
        text = tokenizer.decode(responses[i, : response_lengths[i]], skip_special_tokens=True)
        if strip_eos and eos and text.endswith(eos):
            text = text[: -len(eos)]
        out.responses.append(text)
        out.ground_truths.append(columns["reward_model"][i].get("ground_truth"))
        out.extra_infos.append(dict(extras[i] or {}) if extras is not None else {})
    return out


def show(decoded: DecodedBatch, i: int, result) -> None:
    print("[prompt]", decoded.prompts[i])
    print("[response]", decoded.responses[i])
    print("[ground_truth]", decoded.ground_truths[i])
    for key, value in (result.items() if isinstance(result, dict) else [("score", result)]):
        print(f"[{key}]", value)

"""The SFT trainer's summed negative log-likelihood against a float64 reference on the same model."""
import contextlib
from types import SimpleNamespace

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl.trainer.sft_trainer import SFTTrainer


def test_nll_of_the_trained_tokens_matches_a_float64_reference():
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    rows = [{"input_ids": torch.tensor([3, 7, 9, 11, 4, 5]), "loss_mask": torch.tensor([0, 0, 0, 1, 1, 1])},
            {"input_ids": torch.tensor([8, 2, 6]), "loss_mask": torch.tensor([0, 1, 1])}]   # right-padded by 3
    trainer = SimpleNamespace(module=model, device=torch.device("cpu"), pad_id=0, sp_group=None,
                              planned=SimpleNamespace(precision=SimpleNamespace(autocast=contextlib.nullcontext)))
    nll, count = SFTTrainer._nll(trainer, rows)

    reference, tokens = 0.0, 0
    double = model.double()
    for row in rows:
        ids = row["input_ids"].unsqueeze(0)
        logp = torch.log_softmax(double(input_ids=ids).logits[0, :-1], dim=-1)
        for t in range(len(row["input_ids"]) - 1):
            if row["loss_mask"][t + 1]:
                reference -= float(logp[t, row["input_ids"][t + 1]])
                tokens += 1
    assert count == tokens == 5
    assert abs(float(nll) - reference) < 1e-4 * abs(reference)   # float32 forward against float64

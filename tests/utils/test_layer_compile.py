"""Decoder layers compiled for training and log-prob passes (the plan's torch_compile) compute what the
eager layers compute, with one compiled graph per grad mode across widths and layers, and leave
generation (HF cache path, static decoder) eager.

CPU plans never compile (its inductor backend generates C++ for minutes), so the wiring is tested with
torch.compile's `aot_eager` backend: dynamo's graph and AOTAutograd's forward/backward split, run by
torch's own kernels, wrapped to count the calls into compiled code. float32, tolerances 1e-6.
"""
import pytest
import torch
from torch._dynamo.utils import counters
from transformers import AutoModelForCausalLM

from verl.workers.model_building.layer_compile import compile_decoder_layers
from verl.utils.tiny_model import build_tiny_model_dir
from verl.workers.rollout.static_decoder import StaticDecoder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model_dir(str(tmp_path_factory.mktemp("tiny")), hidden_size=32, num_layers=3,
                                intermediate_size=64, num_heads=4, num_kv_heads=2, seed=0)


class CountingBackend:
    """aot_eager, counting the calls into compiled code."""

    def __init__(self):
        self.calls = 0

    def __call__(self, gm, example_inputs):
        compiled = torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

        def run(*args):
            self.calls += 1
            return compiled(*args)

        return run


def _load(model_dir, backend=None, checkpointing=False):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    if checkpointing:    # as model_loading sets it up, before the worker compiles the layers
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if backend is not None:
        assert compile_decoder_layers(model, backend=backend) == model.config.num_hidden_layers
    return model


def _batch(rows: int, width: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 200, (rows, width), generator=g)
    mask = torch.ones_like(ids)
    mask[0, : width // 3] = 0                       # a left-padded row
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


def _loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    logits = model(**batch, use_cache=False).logits.float()
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch["input_ids"][:, 1:].flatten(),
                                             reduction="none")
    loss = (loss * batch["attention_mask"][:, 1:].flatten()).sum() / batch["attention_mask"][:, 1:].sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("checkpointing", [False, True])
def test_compiled_layers_give_eager_loss_and_gradients_with_one_graph_across_widths(model_dir, checkpointing):
    torch._dynamo.reset()
    counters.clear()
    backend = CountingBackend()
    eager, compiled = (_load(model_dir, b, checkpointing).train() for b in (None, backend))
    assert list(compiled.state_dict()) == list(eager.state_dict())   # checkpoints see the same names
    layers = compiled.config.num_hidden_layers
    graphs = []
    # micro-batches of other row counts and padded widths (64-column steps) reuse the compiled graphs
    for rows, width in ((3, 64), (2, 128), (4, 192)):
        batch = _batch(rows, width, seed=width)
        calls = backend.calls
        loss_e, grads_e = _loss_and_grads(eager, batch)
        loss_c, grads_c = _loss_and_grads(compiled, batch)
        # every layer ran compiled code, and again in backward where checkpointing recomputes it
        assert backend.calls - calls == layers * (2 if checkpointing else 1)
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-6, atol=1e-6)
        for name, grad in grads_e.items():
            torch.testing.assert_close(grads_c[name], grad, rtol=1e-6, atol=1e-6, msg=name)
        with torch.no_grad():                          # the log-prob pass: its own (no-grad) graph
            torch.testing.assert_close(compiled(**batch, use_cache=False).logits,
                                       eager(**batch, use_cache=False).logits, rtol=1e-6, atol=1e-6)
        graphs.append(counters["stats"]["unique_graphs"])
    # one train and one no-grad graph (with checkpointing, transformers makes the embeddings' output
    # require grad, so the no-grad pass's first layer gets a graph of its own), then none more whatever
    # the width, row count or layer
    assert graphs[0] == graphs[-1] <= (3 if checkpointing else 2), graphs


def test_generation_stays_eager_and_the_static_decoder_is_unaffected(model_dir):
    """transformers' cached forward (the HF rollout path) and the built-in rollout's static decoder
    (which calls the layers' submodules) never enter compiled code and give the eager model's logits."""
    torch._dynamo.reset()
    counters.clear()
    backend = CountingBackend()
    eager, compiled = _load(model_dir).eval(), _load(model_dir, backend).eval()
    batch = _batch(2, 8, seed=1)
    with torch.no_grad():
        out = {}
        for name, model in (("eager", eager), ("compiled", compiled)):
            first = model(**batch, use_cache=True)
            step = model(input_ids=batch["input_ids"][:, -1:], position_ids=batch["position_ids"][:, -1:] + 1,
                         attention_mask=torch.cat([batch["attention_mask"], torch.ones(2, 1, dtype=torch.long)], 1),
                         past_key_values=first.past_key_values, use_cache=True)
            decoder = StaticDecoder(model, 2, 12, 12, torch.float32, torch.device("cpu"))
            prefill = decoder.prefill(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
            decode = decoder.decode(batch["input_ids"][:, -1], batch["position_ids"][:, -1] + 1, 8)
            out[name] = (first.logits, step.logits, prefill, decode)
        assert backend.calls == 0 and counters["stats"]["unique_graphs"] == 0
        for a, b in zip(out["compiled"], out["eager"]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        compiled(**batch, use_cache=False)              # a log-prob pass on the same model does compile
        assert backend.calls == compiled.config.num_hidden_layers


def test_a_vision_language_model_compiles_its_decoder_layers_and_leaves_the_vision_blocks_eager(tmp_path):
    from transformers import AutoModelForImageTextToText

    from tiny_vl_model import build_tiny_vl_model_dir

    model = AutoModelForImageTextToText.from_pretrained(build_tiny_vl_model_dir(str(tmp_path / "vl")))
    assert compile_decoder_layers(model, backend="aot_eager") == model.config.text_config.num_hidden_layers
    compiled = {type(m).__name__ for m in model.modules() if "forward" in vars(m)}   # forward replaced per instance
    assert compiled == {"Qwen2_5_VLDecoderLayer"}


def test_compiled_layers_keep_the_hidden_and_head_size_out_of_their_symbols(model_dir):
    """Rows and width vary between micro-batches and compile as symbols; the layer input's hidden size and the
    rotary tables' head size are model constants and compile as constants (see `_static_feature_dims`)."""
    torch._dynamo.reset()
    symbolic = {}

    def backend(gm, example_inputs):
        for node in gm.graph.find_nodes(op="placeholder"):
            value = node.meta.get("example_value")
            if isinstance(value, torch.Tensor) and "parameters" not in node.name:
                symbolic[node.name] = tuple(isinstance(d, torch.SymInt) for d in value.shape)
        return gm.forward

    model = _load(model_dir, backend).eval()
    with torch.no_grad():
        model(**_batch(3, 64, seed=0), use_cache=False)
    hidden = [s for name, s in symbolic.items() if name.startswith("l_args_0")]
    tables = [s for name, s in symbolic.items() if "position_embeddings" in name]
    assert hidden == [(True, True, False)]             # rows, width; hidden size
    assert len(tables) == 2 and all(not s[-1] for s in tables), symbolic   # cos and sin: head size constant

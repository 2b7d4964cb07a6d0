"""HFRollout on a tiny random Qwen2 model (built here from a config; nothing is downloaded).

Greedy decoding is checked token for token against a plain no-cache argmax loop over each unpadded
prompt, which covers the KV cache, left padding, attention masks and position ids at once. The
sampling filters are checked against a float64 reference written with Python loops.
"""

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl.protocol import DataProto
from verl.workers.rollout import BaseRollout, HFRollout, filter_logits
from verl.workers.rollout.hf_rollout import SamplingParams, sample_next_token

torch.set_num_threads(1)
VOCAB, PAD = 96, 0
NO_EOS = [VOCAB + 7]  # an id the model can never produce: decoding runs to response_length


def _tiny_qwen2(attn="sdpa", seed=0):
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.3,  # decisive logits, so greedy argmax has no near-ties
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = attn
    return Qwen2ForCausalLM(cfg).float().train()


@pytest.fixture(scope="module")
def model():
    return _tiny_qwen2()


def _config(**over):
    base = {
        "temperature": 1.0,
        "top_k": -1,
        "top_p": 1.0,
        "do_sample": True,
        "prompt_length": 8,
        "response_length": 6,
        "n": 1,
        "seed": 7,
        "ignore_eos": False,
        "val_kwargs": {"temperature": 0, "top_k": -1, "top_p": 1.0, "do_sample": False, "n": 1},
    }
    cfg = OmegaConf.create(base)
    for k, v in over.items():
        OmegaConf.update(cfg, k, v)
    return cfg


PROMPTS = [[5, 17, 33, 2], [9, 4, 61, 22, 8, 13, 40], [71], [30, 30, 12, 55, 3]]


def _batch(prompts, prompt_length, **meta):
    """Left-pad token lists to prompt_length, the way RLHFDataset does."""
    ids = torch.full((len(prompts), prompt_length), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, prompt_length - len(p):] = torch.tensor(p)
        mask[i, prompt_length - len(p):] = 1
    pos = torch.clamp(mask.cumsum(-1) - 1, min=0)
    info = {"eos_token_id": NO_EOS, "pad_token_id": PAD}
    info.update(meta)
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos},
        non_tensors={"uid": np.array([f"p{i}" for i in range(len(prompts))], dtype=object)},
        meta_info=info,
    )


@torch.no_grad()
def _greedy_reference(model, prompt, steps, eos=()):
    """Argmax over the full sequence every step: no cache, no padding, default positions."""
    seq = list(prompt)
    out = []
    for _ in range(steps):
        logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
        tok = int(torch.argmax(logits.double()))
        out.append(tok)
        if tok in eos:
            break
        seq.append(tok)
    return out


def _greedy(model, prompts, prompt_length=8, response_length=6, **meta):
    rollout = HFRollout(model, _config(response_length=response_length, do_sample=False))
    return rollout.generate_sequences(_batch(prompts, prompt_length, **meta))


# ---------------------------------------------------------------- sampling filters


def _filter_reference(row, top_k, top_p):
    """Set of kept token ids, computed in float64 by sorting and accumulating."""
    order = sorted(range(len(row)), key=lambda j: -row[j])
    if 0 < top_k < len(row):
        order = order[:top_k]
    top = row[order[0]]
    z = sum(math.exp(row[j] - top) for j in order)
    kept, mass = set(), 0.0
    for j in order:
        if top_p < 1.0 and mass >= top_p:
            break
        kept.add(j)
        mass += math.exp(row[j] - top) / z
    return kept


@pytest.mark.parametrize("top_k,top_p", [(0, 0.5), (0, 0.9), (0, 0.999), (5, 1.0), (1, 1.0), (8, 0.7), (-1, 0.05)])
def test_filter_logits_keeps_exact_nucleus(top_k, top_p):
    g = torch.Generator().manual_seed(top_k * 100 + int(top_p * 1000))
    logits = torch.randn(16, 40, generator=g, dtype=torch.float64) * 2.5
    out = filter_logits(logits.float(), top_k=top_k, top_p=top_p)
    assert out.dtype == torch.float32
    for i in range(16):
        kept = {j for j in range(40) if math.isfinite(out[i, j].item())}
        assert kept == _filter_reference([float(v) for v in logits[i]], top_k, top_p)
        for j in kept:  # kept logits are untouched
            assert out[i, j].item() == pytest.approx(float(logits[i, j]), rel=1e-6)


def test_filter_logits_noop_and_half_input():
    x = torch.randn(3, 10).half()
    out = filter_logits(x, top_k=0, top_p=1.0)
    assert out.dtype == torch.float32 and torch.equal(out, x.float())
    with pytest.raises(ValueError, match="top_p"):
        filter_logits(x, top_p=0.0)


def test_sampled_frequencies_follow_temperature_and_nucleus():
    base = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    logits = base.repeat(20000, 1)
    g = torch.Generator().manual_seed(0)
    # temperature 2 flattens p to p^(1/2)/Z; top_p=0.8 then keeps the first three of those
    tok = sample_next_token(logits, SamplingParams(True, 2.0, 0, 0.8), g)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64).sqrt()
    p = p / p.sum()
    assert float(p[:2].sum()) < 0.8 <= float(p[:3].sum())
    expected = torch.cat([p[:3] / p[:3].sum(), torch.zeros(1, dtype=torch.float64)])
    freq = torch.bincount(tok, minlength=4).double() / len(tok)
    torch.testing.assert_close(freq, expected, atol=0.012, rtol=0)  # ~4 standard errors at n=20000


def test_sampled_frequencies_plain_softmax_and_dropped_tokens_never_drawn():
    """Temperature 1, no filters (the GRPO setting): the race sampler draws softmax(x) exactly; a -inf logit
    (a token a filter dropped) is never drawn, even beside a single finite one."""
    p = torch.tensor([0.6, 0.25, 0.1, 0.05], dtype=torch.float64)
    logits = torch.log(p).float().repeat(20000, 1)
    logits[::2, 3] = float("-inf")
    g = torch.Generator().manual_seed(1)
    tok = sample_next_token(logits, SamplingParams(True, 1.0, 0, 1.0), g)
    odd = torch.bincount(tok[1::2], minlength=4).double() / 10000
    even = torch.bincount(tok[::2], minlength=4).double() / 10000
    torch.testing.assert_close(odd, p, atol=0.017, rtol=0)   # ~4 standard errors at n=10000
    torch.testing.assert_close(even, torch.cat([p[:3] / p[:3].sum(), torch.zeros(1, dtype=torch.float64)]),
                               atol=0.017, rtol=0)
    one = torch.full((1000, 50), float("-inf"))
    one[:, 7] = 0.0
    assert torch.equal(sample_next_token(one, SamplingParams(), g), torch.full((1000,), 7))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_race_kernel_draws_the_same_tokens_as_the_float32_sampler(dtype, temperature):
    """The one-pass race (`race_winner`, what `compiled_race` compiles) reads half logits as they are and takes
    the same draws from the stream: every row's token equals the float32 path's, and the streams stay equal.
    Under compilation (`aot_eager`: torch.compile's tracing, no generated code) too."""
    from verl.workers.rollout.hf_rollout import race_winner

    logits = (torch.randn(64, 3000, generator=torch.Generator().manual_seed(2)) * 3).to(dtype)
    logits[5, 17] = float("-inf")
    params = SamplingParams(True, temperature, 0, 1.0)
    kernels = [race_winner, torch.compile(race_winner, backend="aot_eager", fullgraph=True, dynamic=True)]
    streams = [torch.Generator().manual_seed(9) for _ in range(len(kernels) + 1)]
    for _ in range(3):
        want = sample_next_token(logits, params, streams[0])
        for kernel, g in zip(kernels, streams[1:]):
            assert torch.equal(sample_next_token(logits, params, g, race_kernel=kernel), want)
    assert all(torch.equal(g.get_state(), streams[0].get_state()) for g in streams[1:])
    # filters and greedy keep their own paths; greedy over half logits is the float32 argmax
    filtered = SamplingParams(True, temperature, 5, 1.0)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(sample_next_token(logits, filtered, g1, race_kernel=race_winner), sample_next_token(logits, filtered, g2))
    assert torch.equal(sample_next_token(logits, SamplingParams(False), None), logits.float().argmax(-1))


# ---------------------------------------------------------------- greedy decoding


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_greedy_equals_no_cache_reference(attn):
    model = _tiny_qwen2(attn)
    out = _greedy(model, PROMPTS, response_length=6)
    for i, p in enumerate(PROMPTS):
        assert out.batch["responses"][i].tolist() == _greedy_reference(model, p, 6)


def test_left_padding_invariance(model):
    short = _greedy(model, PROMPTS, prompt_length=8).batch["responses"]
    long = _greedy(model, PROMPTS, prompt_length=15).batch["responses"]
    assert torch.equal(short, long)


def test_eos_stops_rows_and_sets_response_mask(model):
    free = _greedy(model, PROMPTS, response_length=8).batch["responses"]
    eos = int(free[1, 2])  # make row 1's third token the EOS
    out = _greedy(model, PROMPTS, response_length=8, eos_token_id=[eos, NO_EOS[0]])
    resp, rmask = out.batch["responses"], out.batch["response_mask"]
    for i, p in enumerate(PROMPTS):
        ref = _greedy_reference(model, p, 8, eos={eos})
        n = len(ref)
        assert resp[i, :n].tolist() == ref
        assert resp[i, n:].tolist() == [PAD] * (8 - n)
        assert rmask[i].tolist() == [1] * n + [0] * (8 - n)
    assert rmask[1].tolist()[:4] == [1, 1, 1, 0]
    assert torch.equal(out.batch["attention_mask"][:, 8:], rmask)


def test_stops_early_when_all_rows_finish(model):
    free = _greedy(model, PROMPTS[:1], response_length=6).batch["responses"]
    calls = []  # every pass over the model (prefill or decode step) embeds its input tokens once
    rollout = HFRollout(model, _config(do_sample=False, response_length=6))
    hook = model.model.embed_tokens.register_forward_hook(lambda *_: calls.append(1))
    try:
        out = rollout.generate_sequences(_batch(PROMPTS[:1], 8, eos_token_id=int(free[0, 1])))
    finally:
        hook.remove()
    assert len(calls) == 2  # prefill + one decode step, then every row had produced EOS
    assert out.batch["responses"].shape == (1, 6)


def test_ignore_eos_runs_to_full_length(model):
    free = _greedy(model, PROMPTS, response_length=5).batch["responses"]
    rollout = HFRollout(model, _config(do_sample=False, response_length=5, ignore_eos=True))
    out = rollout.generate_sequences(_batch(PROMPTS, 8, eos_token_id=int(free[0, 0])))
    assert torch.equal(out.batch["responses"], free)
    assert out.batch["response_mask"].all()


# ---------------------------------------------------------------- output contract


def test_output_keys_shapes_and_positions(model):
    prompts = _batch(PROMPTS, 8, validate=False, extra="kept")
    out = HFRollout(model, _config(response_length=5)).generate_sequences(prompts)
    assert isinstance(HFRollout(model, _config()), BaseRollout)
    b = out.batch
    assert set(b.keys()) == {"prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids"}
    assert b["prompts"].shape == (4, 8) and b["responses"].shape == (4, 5) and b["response_mask"].shape == (4, 5)
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert b[key].shape == (4, 13)
    assert torch.equal(b["prompts"], prompts.batch["input_ids"])
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], -1))
    assert torch.equal(b["attention_mask"][:, :8], prompts.batch["attention_mask"])
    assert torch.equal(b["position_ids"][:, :8], prompts.batch["position_ids"])
    for i, p in enumerate(PROMPTS):
        assert b["position_ids"][i, 8:].tolist() == list(range(len(p), len(p) + 5))
    assert out.meta_info["extra"] == "kept" and out.meta_info["pad_token_id"] == PAD
    assert list(out.non_tensor_batch["uid"]) == ["p0", "p1", "p2", "p3"]
    assert b["responses"].dtype == torch.long and b["attention_mask"].dtype == prompts.batch["attention_mask"].dtype
    assert model.training  # the caller's train/eval mode is restored


def test_micro_batches_match_one_batch(model):
    whole = _greedy(model, PROMPTS).batch["responses"]
    rollout = HFRollout(model, _config(do_sample=False, micro_batch_size=3))
    parts = rollout.generate_sequences(_batch(PROMPTS, 8))
    assert torch.equal(parts.batch["responses"], whole)


def test_plan_micro_batch_bounds_every_forward(model):
    """A batch larger than the plan's micro-batch is generated in chunks, each exactly as if alone,
    and no forward (prefill or decode step) ever sees more rows than the micro-batch."""
    from types import SimpleNamespace

    prompts = PROMPTS + [[12, 7], [44, 45, 46, 47, 48, 49], [3]]
    plan = SimpleNamespace(rollout=SimpleNamespace(dtype="float32", micro_batch_size=3))
    rows = []
    hook = model.model.embed_tokens.register_forward_pre_hook(lambda _m, args: rows.append(args[0].shape[0]))
    try:
        # the plan's size wins over the config's
        out = HFRollout(model, _config(do_sample=False, micro_batch_size=100), plan=plan).generate_sequences(
            _batch(prompts, 8))
    finally:
        hook.remove()
    assert max(rows) == 3 and set(rows) == {3, 1}          # chunks of 3, 3 and 1 rows
    alone = [_greedy(model, prompts[i:i + 3]).batch["responses"] for i in range(0, len(prompts), 3)]
    assert torch.equal(out.batch["responses"], torch.cat(alone))
    assert list(out.non_tensor_batch["uid"]) == [f"p{i}" for i in range(len(prompts))]   # order kept
    assert out.batch["responses"].tolist() == [_greedy_reference(model, p, 6) for p in prompts]


def test_top_k_one_equals_greedy(model):
    greedy = _greedy(model, PROMPTS).batch["responses"]
    rollout = HFRollout(model, _config(do_sample=True, top_k=1, temperature=0.7))
    assert torch.equal(rollout.generate_sequences(_batch(PROMPTS, 8)).batch["responses"], greedy)


def test_sampling_is_seeded_and_varies(model):
    rollout = HFRollout(model, _config(do_sample=True, temperature=1.5, response_length=8))
    prompts = [PROMPTS[0]] * 6
    a = rollout.generate_sequences(_batch(prompts, 8, seed=3)).batch["responses"]
    b = rollout.generate_sequences(_batch(prompts, 8, seed=3)).batch["responses"]
    c = rollout.generate_sequences(_batch(prompts, 8, seed=4)).batch["responses"]
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert len({tuple(r) for r in a.tolist()}) > 1  # repeated prompts get different samples
    # without a per-call seed the stream continues across calls (rollout.seed makes runs repeatable)
    fresh = [HFRollout(model, _config(do_sample=True, temperature=1.5, response_length=8)) for _ in range(2)]
    runs = [[r.generate_sequences(_batch(prompts, 8)).batch["responses"] for _ in range(2)] for r in fresh]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    assert not torch.equal(runs[0][0], runs[0][1])


def test_val_kwargs_used_when_validate(model):
    greedy = _greedy(model, PROMPTS).batch["responses"]
    rollout = HFRollout(model, _config(do_sample=True, temperature=5.0))  # wild sampling for training
    val = rollout.generate_sequences(_batch(PROMPTS, 8, validate=True, seed=0)).batch["responses"]
    assert torch.equal(val, greedy)  # val_kwargs: do_sample False
    assert rollout.sampling_params({"validate": True}) == SamplingParams(False, 0.0, -1, 1.0)
    assert rollout.sampling_params({}) == SamplingParams(True, 5.0, -1, 1.0)
    # the trainer passes do_sample from val_kwargs explicitly; explicit meta_info keys win
    assert rollout.sampling_params({"validate": True, "do_sample": True, "temperature": 0.6}).temperature == 0.6
    sampled_val = HFRollout(model, _config(**{"val_kwargs.do_sample": True, "val_kwargs.temperature": 1.0,
                                              "val_kwargs.top_k": 1}))
    assert torch.equal(sampled_val.generate_sequences(_batch(PROMPTS, 8, validate=True)).batch["responses"], greedy)


def test_missing_eos_is_a_clear_error():
    model = _tiny_qwen2()
    model.config.eos_token_id = None
    prompts = _batch(PROMPTS, 8)
    del prompts.meta_info["eos_token_id"]
    with pytest.raises(ValueError, match="eos_token_id"):
        HFRollout(model, _config()).generate_sequences(prompts)


# ---------------------------------------------------------------- FSDP2 across two CPU ranks


def _fsdp_rank(rank, world, port, out_dir, eos):
    """Generate this rank's half of PROMPTS twice: weights left sharded, then unsharded up front."""
    import datetime
    import os

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from verl.utils.fsdp_utils import full_params

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        model = _tiny_qwen2()
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        rollout = HFRollout(model, _config(do_sample=False, response_length=6))
        batch = _batch(PROMPTS[:2] if rank == 0 else PROMPTS[2:], 8, eos_token_id=eos)

        sharded = rollout.generate_sequences(batch)  # per-step all-gathers: ranks must stay in lock-step

        with full_params(model):  # what the actor worker does: gather once, then each rank stops on its own
            unsharded = rollout.generate_sequences(batch)
        # uneven rows with micro-batch 1 and sharded weights: rank 1 must idle through rank 0's extra passes
        chunked = HFRollout(model, _config(do_sample=False, response_length=6, micro_batch_size=1))
        uneven = chunked.generate_sequences(_batch(PROMPTS[:3] if rank == 0 else PROMPTS[3:], 8, eos_token_id=eos))
        torch.save({"sharded": sharded.batch["responses"], "unsharded": unsharded.batch["responses"],
                    "uneven": uneven.batch["responses"]}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_fsdp2_two_ranks_stopping_at_different_steps(tmp_path, model):
    import socket
    import time

    import torch.multiprocessing as mp

    free = _greedy(model, PROMPTS, response_length=6).batch["responses"]
    eos = [int(free[0, 1]), int(free[1, 1])]  # both of rank 0's rows stop after 2 tokens; rank 1's run on
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.start_processes(_fsdp_rank, args=(2, port, str(tmp_path), eos), nprocs=2, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + 150
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("FSDP2 ranks did not finish within 150 s (a collective mismatch would hang here)")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    expected = _greedy(model, PROMPTS, response_length=6, eos_token_id=eos).batch["responses"]
    assert torch.equal(expected[2:], free[2:]) and expected[:2, 2:].eq(PAD).all()  # ranks stop at different steps
    for mode in ("sharded", "unsharded", "uneven"):
        assert torch.equal(torch.cat([r[mode] for r in ranks]), expected), mode
    assert [len(r["uneven"]) for r in ranks] == [3, 1]


# ---------------------------------------------------------------- CUDA


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_greedy_sampling_and_plan_autocast():
    from types import SimpleNamespace

    device = torch.device("cuda", torch.cuda.current_device())
    cpu_model = _tiny_qwen2()
    model = _tiny_qwen2().to(device)
    out = _greedy(model, PROMPTS)  # prompts stay on the CPU: outputs come back where inputs were
    assert out.batch["responses"].device.type == "cpu"
    assert out.batch["responses"].tolist() == [_greedy_reference(cpu_model, p, 6) for p in PROMPTS]

    rollout = HFRollout(model, _config(do_sample=True, temperature=1.2, top_p=0.9, top_k=20))
    gpu_batch = _batch(PROMPTS, 8, seed=11).to(device)
    a = rollout.generate_sequences(gpu_batch).batch["responses"]
    b = rollout.generate_sequences(gpu_batch).batch["responses"]
    assert a.device == device and torch.equal(a, b)

    plan = SimpleNamespace(rollout=SimpleNamespace(dtype="float16", micro_batch_size=None))
    half = HFRollout(model, _config(do_sample=False), plan=plan).generate_sequences(_batch(PROMPTS, 8))
    assert next(model.parameters()).dtype == torch.float32  # autocast only; weights untouched
    assert half.batch["responses"].shape == (4, 6) and half.batch["responses"].max() < VOCAB


# ---------------------------------------------------------------- rollout dtype (the engine's decision)


def test_autocast_decision_follows_the_rollout_dtype_not_the_weights():
    from verl.workers.rollout.hf_rollout import rollout_autocast_dtype

    half, bf16, fp32 = torch.float16, torch.bfloat16, torch.float32
    assert rollout_autocast_dtype(None, fp32) is None        # no plan: the weights' own dtype
    assert rollout_autocast_dtype(fp32, fp32) is None        # float32 rollout over float32 weights
    assert rollout_autocast_dtype(bf16, bf16) is None        # weights already gathered in the rollout dtype
    assert rollout_autocast_dtype(half, fp32) == half
    assert rollout_autocast_dtype(bf16, fp32) == bf16
    assert rollout_autocast_dtype(half, bf16) == half        # a rollout dtype other than the compute dtype wins
    with pytest.raises(ValueError, match="actor_rollout_ref.rollout.dtype"):
        rollout_autocast_dtype(fp32, bf16)                   # autocast cannot raise precision: say so


def _dtypes_seen(model, plan_dtype):
    """(autocast enabled, autocast dtype) at every forward of a CPU generation under `plan_dtype`."""
    from types import SimpleNamespace

    seen = []
    hook = model.model.embed_tokens.register_forward_pre_hook(
        lambda *_: seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))))
    try:
        plan = None if plan_dtype is None else SimpleNamespace(
            rollout=SimpleNamespace(dtype=plan_dtype, micro_batch_size=None))
        out = HFRollout(model, _config(do_sample=False, response_length=3), plan=plan).generate_sequences(
            _batch(PROMPTS, 8))
    finally:
        hook.remove()
    assert out.batch["responses"].shape == (4, 3)
    return set(seen)


def test_engine_autocasts_to_the_plan_rollout_dtype_on_cpu_too(model):
    assert _dtypes_seen(model, "bfloat16") == {(True, torch.bfloat16)}
    assert _dtypes_seen(model, "float16") == {(True, torch.float16)}
    assert not any(enabled for enabled, _ in _dtypes_seen(model, "float32"))
    assert not any(enabled for enabled, _ in _dtypes_seen(model, None))
    assert next(model.parameters()).dtype == torch.float32   # autocast only; weights untouched


def test_unresolved_auto_micro_batch_means_the_whole_batch():
    """A config straight from the yaml (`micro_batch_size: auto`, no plan) generates in one piece."""
    from omegaconf import OmegaConf

    engine = HFRollout(torch.nn.Linear(2, 2), OmegaConf.create({"micro_batch_size": "auto"}))
    assert engine.micro_batch_size is None

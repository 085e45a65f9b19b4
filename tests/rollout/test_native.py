"""The native engine: exactness against a no-cache reference, output layout, log-probs,
n samples, seeds, stop tokens / strings, compaction, and the sampling distribution."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from verl.models.tiny import build_tiny_model
from verl.rollout import SamplingParams, build_rollout
from verl.rollout.native import NativeRollout

from .conftest import PROMPTS, make_batch


def naive_greedy(model, batch, max_new: int, stop_ids: list[int]) -> list[list[int]]:
    """No cache, no padding: one full forward per token, per prompt."""
    out = []
    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]
    with torch.no_grad():
        for row, m in zip(ids, mask):
            seq = row[m.bool()].tolist()
            gen: list[int] = []
            for _ in range(max_new):
                token = int(model(torch.tensor([seq])).logits[0, -1].argmax())
                gen.append(token)
                seq.append(token)
                if token in stop_ids:
                    break
            out.append(gen)
    return out


def recomputed_log_probs(model, out, temperature: float) -> torch.Tensor:
    """What the trainer computes: one forward over prompt + response, tempered log-softmax."""
    prompt_len = out.batch["prompts"].shape[1]
    resp = out.batch["responses"]
    with torch.no_grad():
        logits = model(
            input_ids=out.batch["input_ids"],
            attention_mask=out.batch["attention_mask"],
            position_ids=out.batch["position_ids"],
        ).logits
    logits = logits[:, prompt_len - 1 : -1].float() / temperature
    return logits.log_softmax(-1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)


def responses_as_lists(out) -> list[list[int]]:
    lengths = out.batch["response_mask"].sum(-1).tolist()
    return [r[:n] for r, n in zip(out.batch["responses"].tolist(), lengths)]


def test_greedy_matches_no_cache_reference(model, tokenizer, batch):
    engine = NativeRollout(model, tokenizer)
    out = engine.generate(batch, SamplingParams(do_sample=False, max_new_tokens=12))
    got = responses_as_lists(out)
    assert got == naive_greedy(model, batch, 12, [tokenizer.eos_token_id])
    assert len({tuple(r) for r in got}) == len(PROMPTS)  # the model gives varied outputs
    assert all(len(set(r)) > 3 for r in got)


def test_output_layout(model, tokenizer, batch):
    n, max_new = 3, 10
    out = NativeRollout(model, tokenizer).generate(
        batch, SamplingParams(n=n, max_new_tokens=max_new, seed=0)
    )
    rows, prompt_len = len(PROMPTS) * n, batch.batch["input_ids"].shape[1]
    b = out.batch
    assert b["prompts"].shape == (rows, prompt_len)
    assert b["responses"].shape == b["response_mask"].shape == (rows, max_new)
    assert b["rollout_log_probs"].shape == (rows, max_new)
    assert b["rollout_log_probs"].dtype == torch.float32
    assert b["response_mask"].dtype == batch.batch["attention_mask"].dtype
    assert torch.equal(b["prompts"], batch.batch["input_ids"].repeat_interleave(n, 0))
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], 1))
    prompt_mask = batch.batch["attention_mask"].repeat_interleave(n, 0)
    assert torch.equal(b["attention_mask"], torch.cat([prompt_mask, b["response_mask"]], 1))
    last = batch.batch["position_ids"][:, -1].repeat_interleave(n)
    expected_pos = last[:, None] + torch.arange(1, max_new + 1)
    assert torch.equal(b["position_ids"][:, prompt_len:], expected_pos)
    assert torch.equal(
        b["position_ids"][:, :prompt_len], batch.batch["position_ids"].repeat_interleave(n, 0)
    )
    assert list(out.non_tensor_batch["uid"]) == [f"u{i}" for i in range(4) for _ in range(n)]
    assert out.meta_info == {"step": 7}
    assert not any(t.is_inference() for t in b.values())  # usable in the trainer's autograd
    # the input batch is left untouched
    assert set(batch.batch) == {"input_ids", "attention_mask", "position_ids"}


def test_stop_token_ends_response_then_pad(model, tokenizer, batch):
    engine = NativeRollout(model, tokenizer)
    free = engine.generate(
        batch, SamplingParams(do_sample=False, max_new_tokens=12, stop_token_ids=[])
    )
    assert free.batch["response_mask"].all()  # no stop ids: every row runs to the cap
    stop = int(free.batch["responses"][0, 4])
    out = engine.generate(
        batch, SamplingParams(do_sample=False, max_new_tokens=12, stop_token_ids=[stop])
    )
    for row_free, row, mask, logp in zip(
        free.batch["responses"].tolist(),
        out.batch["responses"].tolist(),
        out.batch["response_mask"].tolist(),
        out.batch["rollout_log_probs"],
    ):
        end = row_free.index(stop) + 1 if stop in row_free else 12
        assert mask == [1] * end + [0] * (12 - end)
        assert row[:end] == row_free[:end]
        assert row[end:] == [tokenizer.pad_token_id] * (12 - end)
        assert bool((logp[end:] == 0).all()) and bool((logp[:end] < 0).all())
    assert out.batch["response_mask"][0].sum() <= 5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 1.0},
        {"temperature": 0.7},
        {"temperature": 0.7, "top_p": 0.9, "top_k": 20},
        {"do_sample": False, "temperature": 0.6},
    ],
)
def test_rollout_log_probs_match_trainer_recompute(model, tokenizer, batch, kwargs):
    params = SamplingParams(n=2, max_new_tokens=10, seed=3, **kwargs)
    out = NativeRollout(model, tokenizer).generate(batch, params)
    expected = recomputed_log_probs(model, out, params.logprob_temperature)
    mask = out.batch["response_mask"].bool()
    got = out.batch["rollout_log_probs"]
    assert torch.allclose(got[mask], expected[mask], atol=1e-4)
    assert bool((got[~mask] == 0).all())


def test_n_samples_share_prompt_and_differ(model, tokenizer, batch):
    out = NativeRollout(model, tokenizer).generate(
        batch, SamplingParams(n=4, max_new_tokens=8, seed=0)
    )
    responses = out.batch["responses"].view(len(PROMPTS), 4, -1)
    prompts = out.batch["prompts"].view(len(PROMPTS), 4, -1)
    assert bool((prompts == prompts[:, :1]).all())
    for group in responses:
        assert len({tuple(r.tolist()) for r in group}) > 1


def test_prefill_runs_once_per_prompt_and_keeps_one_logit(model, tokenizer, batch):
    calls: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    embed_shapes: list[tuple[int, ...]] = []
    h1 = model.model.embed_tokens.register_forward_hook(
        lambda mod, args, out: embed_shapes.append(tuple(args[0].shape))
    )
    h2 = model.lm_head.register_forward_hook(
        lambda mod, args, out: calls.append((tuple(args[0].shape), tuple(out.shape)))
    )
    try:
        NativeRollout(model, tokenizer).generate(
            batch, SamplingParams(n=4, max_new_tokens=5, seed=0, stop_token_ids=[])
        )
    finally:
        h1.remove()
        h2.remove()
    prompt_len = batch.batch["input_ids"].shape[1]
    assert embed_shapes[0] == (len(PROMPTS), prompt_len)  # B prompts, not B * n
    assert embed_shapes[1:] == [(len(PROMPTS) * 4, 1)] * 4  # max_new - 1 decode steps
    assert calls[0][0][:2] == (len(PROMPTS), 1)  # only the last position reaches lm_head


def test_seed_reproducibility(model, tokenizer, batch):
    engine = NativeRollout(model, tokenizer)
    params = SamplingParams(n=2, max_new_tokens=8, seed=11, temperature=0.9)
    a, b = engine.generate(batch, params), engine.generate(batch, params)
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    assert torch.equal(a.batch["rollout_log_probs"], b.batch["rollout_log_probs"])
    c = engine.generate(batch, SamplingParams(n=2, max_new_tokens=8, seed=12, temperature=0.9))
    assert not torch.equal(a.batch["responses"], c.batch["responses"])
    # seed=None follows the global RNG
    unseeded = SamplingParams(n=2, max_new_tokens=8)
    torch.manual_seed(5)
    d = engine.generate(batch, unseeded)
    torch.manual_seed(5)
    e = engine.generate(batch, unseeded)
    assert torch.equal(d.batch["responses"], e.batch["responses"])


def test_top_k_one_equals_greedy(model, tokenizer, batch):
    engine = NativeRollout(model, tokenizer)
    greedy = engine.generate(batch, SamplingParams(do_sample=False, max_new_tokens=10))
    top1 = engine.generate(batch, SamplingParams(top_k=1, max_new_tokens=10, seed=4))
    assert torch.equal(greedy.batch["responses"], top1.batch["responses"])
    assert torch.equal(greedy.batch["response_mask"], top1.batch["response_mask"])


def test_stop_strings(model, tokenizer, batch):
    engine = NativeRollout(model, tokenizer)
    free = engine.generate(
        batch, SamplingParams(do_sample=False, max_new_tokens=12, stop_token_ids=[])
    )
    row0 = free.batch["responses"][0].tolist()
    text0 = [tokenizer.decode(row0[: t + 1]) for t in range(12)]
    # a stop string completed by token 5 of row 0 (its last 2 characters there)
    stop = text0[5][-2:]
    if not stop.strip():
        pytest.skip("tiny model produced whitespace")
    out = engine.generate(
        batch,
        SamplingParams(do_sample=False, max_new_tokens=12, stop_token_ids=[], stop_strings=[stop]),
    )
    for row, mask in zip(free.batch["responses"].tolist(), out.batch["response_mask"].tolist()):
        texts = [tokenizer.decode(row[: t + 1]) for t in range(12)]
        end = next((t + 1 for t, s in enumerate(texts) if stop in s), 12)
        assert sum(mask) == end
    assert sum(out.batch["response_mask"][0].tolist()) <= 6
    with pytest.raises(ValueError, match="tokenizer"):
        NativeRollout(model).generate(batch, SamplingParams(stop_strings=["x"], max_new_tokens=2))


def test_compaction_does_not_change_results(model, tokenizer, batch):
    # Common tokens as stop ids so rows finish at different steps.
    probe = NativeRollout(model, tokenizer).generate(
        batch, SamplingParams(n=4, max_new_tokens=16, seed=0, stop_token_ids=[])
    )
    counts = np.bincount(probe.batch["responses"].flatten().numpy())
    stops = [int(i) for i in np.argsort(counts)[-3:]]
    params = SamplingParams(n=4, max_new_tokens=16, seed=0, stop_token_ids=stops)
    compacting = NativeRollout(model, tokenizer, compaction_threshold=0.0)
    plain = NativeRollout(model, tokenizer, compaction=False)
    a, b = compacting.generate(batch, params), plain.generate(batch, params)
    lengths = a.batch["response_mask"].sum(-1)
    assert compacting.last_stats["compactions"] > 0 and plain.last_stats["compactions"] == 0
    assert lengths.min() < lengths.max()
    assert compacting.last_stats["decode_row_steps"] < plain.last_stats["decode_row_steps"]
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    assert torch.equal(a.batch["response_mask"], b.batch["response_mask"])
    torch.testing.assert_close(a.batch["rollout_log_probs"], b.batch["rollout_log_probs"])


def test_end_to_end_sampling_distribution(model, tokenizer):
    """One prompt, 4000 samples of one token: frequencies follow softmax(logits / T)."""
    batch = make_batch(tokenizer, ["the answer is"])
    temperature, n = 1.3, 4000
    out = NativeRollout(model, tokenizer).generate(
        batch, SamplingParams(n=n, max_new_tokens=1, temperature=temperature, seed=0)
    )
    with torch.no_grad():
        logits = model(batch.batch["input_ids"]).logits[0, -1]
    probs = (logits / temperature).softmax(-1).double()
    top = probs.argsort(descending=True)[:5]
    counts = torch.bincount(out.batch["responses"][:, 0], minlength=probs.numel()).double()
    expected = torch.cat([probs[top], (1 - probs[top].sum()).reshape(1)]) * n
    observed = torch.cat([counts[top], (n - counts[top].sum()).reshape(1)])
    assert float(probs[top[0]]) > 0.05  # a peaked enough distribution for the test to bite
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 20.5  # 5 degrees of freedom, p = 0.001; seeded, so deterministic


def test_training_mode_restored_and_eval_during_generation(model, tokenizer, batch):
    seen: list[bool] = []
    hook = model.model.layers[0].register_forward_hook(lambda mod, a, o: seen.append(mod.training))
    model.train()
    model.model.layers[1].eval()  # a part the trainer keeps in eval mode stays so
    try:
        NativeRollout(model, tokenizer).generate(batch, SamplingParams(max_new_tokens=3, seed=0))
        assert model.training and model.model.layers[0].training
        assert not model.model.layers[1].training
    finally:
        hook.remove()
        model.eval()
    assert seen and not any(seen)


def test_padding_columns_and_mask_paths_agree(model, tokenizer, batch):
    params = SamplingParams(n=2, max_new_tokens=8, seed=2, temperature=0.8)
    ref = NativeRollout(model, tokenizer).generate(batch, params)
    # two extra all-padding columns on the left
    b = batch.batch
    padded = make_batch(tokenizer, PROMPTS)
    padded.batch["input_ids"] = torch.cat(
        [torch.zeros_like(b["input_ids"][:, :2]), b["input_ids"]], 1
    )
    padded.batch["attention_mask"] = torch.cat(
        [torch.zeros_like(b["attention_mask"][:, :2]), b["attention_mask"]], 1
    )
    padded.batch["position_ids"] = torch.cat(
        [torch.zeros_like(b["position_ids"][:, :2]), b["position_ids"]], 1
    )
    out = NativeRollout(model, tokenizer).generate(padded, params)
    assert torch.equal(out.batch["responses"], ref.batch["responses"])
    two_d = NativeRollout(model, tokenizer)
    two_d._mask_mode = "2d"  # the path for sliding-window / flash-attention models
    out = two_d.generate(batch, params)
    assert torch.equal(out.batch["responses"], ref.batch["responses"])
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    engine = NativeRollout(eager, tokenizer)
    assert engine._mask_mode == "eager"
    out = engine.generate(batch, params)
    assert torch.equal(out.batch["responses"], ref.batch["responses"])
    torch.testing.assert_close(
        out.batch["rollout_log_probs"], ref.batch["rollout_log_probs"], atol=1e-5, rtol=0
    )


def test_llama_architecture(tokenizer, batch):
    llama = build_tiny_model(
        arch="llama", tokenizer=tokenizer, hidden_size=64, num_layers=2, seed=1
    )
    out = build_rollout("native", llama, tokenizer).generate(
        batch, SamplingParams(do_sample=False, max_new_tokens=6)
    )
    assert responses_as_lists(out) == naive_greedy(llama, batch, 6, [tokenizer.eos_token_id])


def test_bad_input_errors(model, tokenizer, batch):
    engine = NativeRollout(model, tokenizer)
    right = make_batch(tokenizer, PROMPTS)
    right.batch["attention_mask"] = right.batch["attention_mask"].flip(-1)
    with pytest.raises(ValueError, match="LEFT-padded"):
        engine.generate(right, SamplingParams(max_new_tokens=2))
    missing = batch.select(batch_keys=["input_ids"])
    with pytest.raises(KeyError, match="attention_mask"):
        engine.generate(missing, SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="compaction_threshold"):
        NativeRollout(model, tokenizer, compaction_threshold=2.0)
    with pytest.raises(TypeError, match=r"no \.config"):
        NativeRollout(torch.nn.Linear(2, 2), eos_token_ids=[1], pad_token_id=0)


def test_cache_passed_under_the_current_transformers_name(model, tokenizer, batch):
    # transformers deprecates ``past_key_values`` (removed in 5.40); a decode step that
    # still used it would warn here and break on upgrade.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        out = NativeRollout(model, tokenizer).generate(
            batch, SamplingParams(n=2, max_new_tokens=4, seed=0, stop_token_ids=[])
        )
    assert out.batch["responses"].shape == (len(PROMPTS) * 2, 4)


def test_peft_wrapped_model_keeps_one_logit(model, tokenizer, batch):
    # A peft wrapper's forward takes **kwargs: the engine must read the base model's
    # signature, or every prefill computes logits for all prompt positions.
    peft = pytest.importorskip("peft")
    wrapped = peft.get_peft_model(
        copy.deepcopy(model), peft.LoraConfig(r=2, target_modules=["q_proj"])
    )
    engine = NativeRollout(wrapped, tokenizer)
    assert engine._logits_kwargs and engine._cache_kwarg in ("cache", "past_key_values")
    shapes: list[tuple[int, ...]] = []
    hook = wrapped.get_base_model().lm_head.register_forward_hook(
        lambda mod, args, out: shapes.append(tuple(out.shape))
    )
    try:
        engine.generate(batch, SamplingParams(n=1, max_new_tokens=2, seed=0, stop_token_ids=[]))
    finally:
        hook.remove()
    assert shapes[0][1] == 1  # prefill kept only the last position


def _counting_backend(graphs: list):
    """A torch.compile backend that runs the captured graph eagerly and records each one."""

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return backend


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_compiled_decode_traces_one_graph_and_matches_eager(tokenizer, batch, attn):
    """The static decode step: same tokens and log-probs as the eager engine, one captured
    graph for every step and for a second generation of the same shape (no recompiles as
    columns fill or between calls). Inductor itself: the slow test below."""
    model = build_tiny_model(tokenizer=tokenizer, hidden_size=64, num_layers=2, seed=3)
    model.config._attn_implementation = attn
    graphs: list = []
    compiled = NativeRollout(
        model, tokenizer, compile_decode=True, compile_backend=_counting_backend(graphs)
    )
    eager = NativeRollout(model, tokenizer)
    eos = tokenizer.eos_token_id
    greedy = SamplingParams(do_sample=False, max_new_tokens=10, stop_token_ids=[eos])
    a, b = compiled.generate(batch, greedy), eager.generate(batch, greedy)
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    assert torch.equal(a.batch["response_mask"], b.batch["response_mask"])
    torch.testing.assert_close(
        a.batch["rollout_log_probs"], b.batch["rollout_log_probs"], atol=1e-5, rtol=1e-5
    )
    # sampling: the static path's logits differ from eager's by float rounding (~5e-7), so a
    # uniform draw that lands on a CDF boundary may pick another token; what must hold is
    # that the compiled engine samples from the model's distribution: its log-probs equal
    # the trainer's recomputation of its own tokens
    sampled = SamplingParams(n=3, max_new_tokens=10, seed=5, stop_token_ids=[eos, 7, 11])
    a = compiled.generate(batch, sampled)
    mask = a.batch["response_mask"].bool()
    assert mask.any()
    torch.testing.assert_close(
        a.batch["rollout_log_probs"][mask],
        recomputed_log_probs(model, a, 1.0)[mask],
        atol=1e-5,
        rtol=1e-5,
    )
    assert compiled.last_stats["compactions"] == 0  # fixed batch width
    first = len(graphs)
    assert first >= 1
    compiled.generate(batch, SamplingParams(n=3, max_new_tokens=10, seed=9))
    assert len(graphs) == first  # same rows and width: no new graph


@pytest.mark.parametrize("compile_decode", [False, True])
def test_allocator_garbage_in_cache_buffers_never_reaches_outputs(
    tokenizer, batch, compile_decode, monkeypatch
):
    """Uninitialised memory may hold NaN (CI saw it after other tests had run): every
    ``torch.empty`` / ``Tensor.new_empty`` returns NaN here, and the engine's log-probs stay
    finite and equal to the trainer's recomputation (a static cache exposes its unwritten
    columns to attention, masked, so they must be zeroed)."""
    real_empty, real_new_empty = torch.empty, torch.Tensor.new_empty

    def nan_empty(*shape, **kwargs):
        out = real_empty(*shape, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    def nan_new_empty(self, *shape, **kwargs):
        out = real_new_empty(self, *shape, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty", nan_empty)
    monkeypatch.setattr(torch.Tensor, "new_empty", nan_new_empty)
    model = build_tiny_model(tokenizer=tokenizer, hidden_size=64, num_layers=2, seed=3)
    engine = NativeRollout(
        model, tokenizer, compile_decode=compile_decode, compile_backend=_counting_backend([])
    )
    sampled = SamplingParams(n=3, max_new_tokens=10, seed=5)
    out = engine.generate(batch, sampled)
    mask = out.batch["response_mask"].bool()
    assert torch.isfinite(out.batch["rollout_log_probs"][mask]).all()
    torch.testing.assert_close(
        out.batch["rollout_log_probs"][mask],
        recomputed_log_probs(model, out, 1.0)[mask],
        atol=1e-5,
        rtol=1e-5,
    )


@pytest.mark.slow
def test_compiled_decode_inductor_same_greedy_tokens_as_eager(model, tokenizer, batch):
    """torch.compile with inductor (C++ codegen; needs a compiler): greedy tokens equal
    to the eager engine's and log-probs within 1e-4, with n > 1 and stop tokens."""
    compiled = NativeRollout(model, tokenizer, compile_decode=True)
    eager = NativeRollout(model, tokenizer)
    probe = eager.generate(batch, SamplingParams(do_sample=False, max_new_tokens=16))
    stop = int(probe.batch["responses"][0, 4])  # ends row 0 at step 5 (at the latest)
    params = SamplingParams(n=2, do_sample=False, max_new_tokens=16, stop_token_ids=[stop])
    a, b = compiled.generate(batch, params), eager.generate(batch, params)
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    assert torch.equal(a.batch["response_mask"], b.batch["response_mask"])
    assert a.batch["response_mask"].sum(-1).min() < 16  # some rows stopped early
    torch.testing.assert_close(
        a.batch["rollout_log_probs"], b.batch["rollout_log_probs"], atol=1e-4, rtol=1e-4
    )


@pytest.mark.parametrize("engine_name", ["native", "hf"])
def test_bf16_autocast_casts_each_weight_once_per_generation(model, tokenizer, batch, engine_name):
    """Under autocast the weights' bf16 casts come from autocast's cache: their number does
    not grow with the decode steps (under torch.inference_mode autocast caches nothing and a
    bf16 rollout cast every weight again at every step). The native engine without its
    packed weights (they replace autocast's casts: tests/rollout/test_native_packed.py)."""
    from torch.profiler import ProfilerActivity, profile

    options = {"pack_weights": False} if engine_name == "native" else {}
    engine = build_rollout(engine_name, model, tokenizer, **options)

    def weight_casts(max_new: int) -> int:
        params = SamplingParams(n=2, max_new_tokens=max_new, temperature=1.0, stop_token_ids=[])
        with (
            torch.autocast("cpu", dtype=torch.bfloat16),
            profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof,
        ):
            engine.generate(batch, params)
        return sum(
            e.count
            for e in prof.key_averages(group_by_input_shape=True)
            if e.key == "aten::_to_copy" and e.input_shapes and e.input_shapes[0] in weight_shapes
        )

    weight_shapes = [list(p.shape) for p in model.parameters() if p.dim() == 2]

    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    short, long = weight_casts(2), weight_casts(8)
    assert short == long
    assert linears <= long <= 2 * linears  # each weight (tied head: maybe once more) once


def _decode_engines(model, tokenizer, monkeypatch):
    """An engine whose decode steps take verl's decode attention (counted) and one whose
    steps take transformers' sdpa."""
    from verl.kernels import decode_attention as da

    calls: list[int] = []
    real = da.decode_attention
    monkeypatch.setattr(da, "decode_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    # the HF forward (the lean one inlines the same decode attention, test_lean_forward.py)
    ours = NativeRollout(model, tokenizer, lean_forward=False)
    theirs = NativeRollout(model, tokenizer)
    theirs._decode_attention = False
    return ours, theirs, calls


def test_decode_steps_in_fp32_stay_on_transformers_sdpa(model, tokenizer, batch, monkeypatch):
    """In fp32 the decode steps take transformers' sdpa (the decode path is for autocast):
    samples and log-probs bit for bit those of an engine that never asks for it."""
    ours, theirs, calls = _decode_engines(model, tokenizer, monkeypatch)
    params = SamplingParams(n=2, max_new_tokens=10, temperature=1.0, seed=5, stop_token_ids=[])
    a = ours.generate(batch, params)
    b = theirs.generate(batch, params)
    assert not calls
    assert ours._cache_precision(torch.device("cpu")) == (None, None)
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    assert torch.equal(a.batch["rollout_log_probs"], b.batch["rollout_log_probs"])


def test_decode_attention_under_bf16_is_closer_to_the_training_pass(
    model, tokenizer, batch, monkeypatch
):
    """Under bf16 autocast the decode path computes the training pass's block-attention
    numerics, so its log-probs sit closer to what the update computes for the same samples
    (packed, shared prompts) than transformers' bf16 SDPA path's do (measured: mean gap
    ~0.011 vs ~0.018 on this model)."""
    from verl.kernels.torch_functional import compute_response_log_probs

    ours, theirs, calls = _decode_engines(model, tokenizer, monkeypatch)
    low = torch.bfloat16

    def gap(engine, seed):
        params = SamplingParams(n=2, max_new_tokens=10, seed=seed, stop_token_ids=[])
        with torch.autocast("cpu", dtype=low), torch.no_grad():
            out = engine.generate(batch, params)
            trained, _ = compute_response_log_probs(
                model,
                out.batch["input_ids"],
                out.batch["attention_mask"],
                out.batch["position_ids"],
                params.max_new_tokens,
                pack=True,
                share_prefix=True,
            )
        mask = out.batch["response_mask"].bool()
        return (out.batch["rollout_log_probs"] - trained)[mask].abs().mean().item()

    with torch.autocast("cpu", dtype=low):
        assert ours._cache_precision(torch.device("cpu")) == (torch.float32, low)
        assert theirs._cache_precision(torch.device("cpu")) == (low, None)
    seeds = range(3)
    ours_gap = sum(gap(ours, s) for s in seeds)
    # the path ran once per layer and decode step
    assert len(calls) == len(seeds) * model.config.num_hidden_layers * (10 - 1)
    theirs_gap = sum(gap(theirs, s) for s in seeds)
    assert ours_gap < theirs_gap

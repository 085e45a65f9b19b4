"""The sglang backend's adapter against a fake engine with SGLang's interface (CPU).

SGLang itself cannot run on this machine (CUDA only); ``tests/rollout/fake_sglang.py`` has its
``Engine`` interface and keeps its own copy of the weights, injected through
``SGLangRollout.engine_factory``. The native engine over the module is the reference.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
import torch

from verl.kernels.torch_functional import compute_response_log_probs
from verl.protocol import DataProto
from verl.rollout import SamplingParams
from verl.rollout.native import NativeRollout
from verl.rollout.sglang_rollout import SGLangRollout
from verl.rollout.weight_sync import WeightSyncTimeout

from .conftest import make_batch
from .fake_sglang import FakeSGLangEngine


class FakeBackedSGLang(SGLangRollout):
    engine_factory = FakeSGLangEngine


@pytest.fixture
def prompts(tokenizer) -> DataProto:
    return make_batch(tokenizer, ["1+2=", "what is 3*4 plus", "7"])


def _engine(model, tokenizer, **kwargs) -> FakeBackedSGLang:
    FakeSGLangEngine.instances.clear()
    return FakeBackedSGLang(model, tokenizer, max_model_len=128, **kwargs)


def _forward_log_probs(model, out: DataProto, temperature: float) -> torch.Tensor:
    b = out.batch
    with torch.no_grad():
        (lp, *_) = compute_response_log_probs(
            model,
            b["input_ids"],
            b["attention_mask"],
            b["position_ids"],
            response_len=b["responses"].shape[1],
            temperature=temperature,
        )
    return lp * b["response_mask"]


def test_greedy_batch_is_the_native_engines_with_stop_tokens(model, tokenizer, prompts):
    engine = _engine(model, tokenizer)
    (fake,) = FakeSGLangEngine.instances
    assert fake.server_args["load_format"] == "dummy" and fake.server_args["tp_size"] == 1
    assert fake.server_args["context_length"] == 128
    native = NativeRollout(model, tokenizer)
    free = SamplingParams(n=1, do_sample=False, max_new_tokens=10, stop_token_ids=[])
    reference = native.generate(prompts, free)
    # a token the greedy responses really produce, as the stop token: rows end there
    stop = int(reference.batch["responses"][0, 3])
    greedy = SamplingParams(n=1, do_sample=False, max_new_tokens=10, stop_token_ids=[stop])
    want, got = native.generate(prompts, greedy), engine.generate(prompts, greedy)
    assert set(got.batch) == set(want.batch)
    for key in want.batch:
        assert got.batch[key].shape == want.batch[key].shape, key
        assert got.batch[key].dtype == want.batch[key].dtype, key
    for key in ("prompts", "responses", "response_mask", "input_ids", "attention_mask"):
        assert torch.equal(got.batch[key], want.batch[key]), key
    assert torch.equal(got.batch["position_ids"], want.batch["position_ids"])
    assert int(got.batch["response_mask"][0].sum()) <= 4  # stopped at (or before) the stop token
    assert torch.allclose(
        got.batch["rollout_log_probs"], want.batch["rollout_log_probs"], atol=1e-5
    )
    # what SGLang was sent: unpadded token ids, SGLang's sampling names, log-probs asked for
    call = fake.calls[-1][1]
    mask = prompts.batch["attention_mask"].bool()
    assert call["input_ids"] == [
        ids[m].tolist() for ids, m in zip(prompts.batch["input_ids"], mask)
    ]
    sp = call["sampling_params"]
    assert sp["temperature"] == 0.0 and sp["stop_token_ids"] == [stop] and sp["n"] == 1
    assert sp["max_new_tokens"] == 10 and sp["no_stop_trim"] is True


def test_n_samples_come_in_repeat_interleave_order_with_the_modules_log_probs(
    model, tokenizer, prompts
):
    engine = _engine(model, tokenizer)
    params = SamplingParams(n=3, temperature=0.8, max_new_tokens=8, stop_token_ids=[])
    out = engine.generate(prompts, params)
    assert out.batch["responses"].shape == (9, 8)
    assert torch.equal(out.batch["prompts"], prompts.batch["input_ids"].repeat_interleave(3, dim=0))
    sent = FakeSGLangEngine.instances[0].calls[-1][1]["input_ids"]
    assert [len(ids) for ids in sent] == [len(ids) for ids in sent[::3] for _ in range(3)]
    assert sent[0] == sent[1] == sent[2] and sent[3] == sent[4] == sent[5]
    lp = out.batch["rollout_log_probs"]
    assert torch.allclose(lp, _forward_log_probs(model, out, 0.8), atol=1e-5)
    assert (lp[out.batch["response_mask"] == 0] == 0).all()
    assert engine.last_stats["response_tokens"] == float(out.batch["response_mask"].sum())


def test_weights_reach_the_engine_only_by_a_bucketed_push(model, tokenizer, prompts):
    model = copy.deepcopy(model)  # changed below; the fixture is shared
    engine = _engine(model, tokenizer, weight_sync_bucket_mb=0.05)
    fake = FakeSGLangEngine.instances[0]
    greedy = SamplingParams(n=1, do_sample=False, max_new_tokens=8, stop_token_ids=[])
    before = engine.generate(prompts, greedy)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    stale = engine.generate(prompts, greedy)
    assert torch.equal(stale.batch["responses"], before.batch["responses"])  # its own copy
    fake.calls.clear()
    stats = engine.update_weights(model.state_dict().items())
    pushes = [c for c in fake.calls if c[0] == "update_weights_from_tensor"]
    megabytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 2**20
    assert stats["megabytes"] == pytest.approx(megabytes)
    assert len(pushes) == stats["buckets"] >= 3  # one SGLang call per bucket
    assert all(p[1]["flush"] is False for p in pushes)
    assert [c[0] for c in fake.calls][-1] == "flush_cache"  # once, after the last bucket
    pushed = [n for p in pushes for n in p[1]["names"]]
    assert pushed == list(model.state_dict())  # lm_head.weight included
    after = engine.generate(prompts, greedy)
    want = NativeRollout(model, tokenizer).generate(prompts, greedy)
    assert not torch.equal(after.batch["responses"], before.batch["responses"])
    assert torch.equal(after.batch["responses"], want.batch["responses"])
    assert torch.allclose(
        after.batch["rollout_log_probs"], want.batch["rollout_log_probs"], atol=1e-5
    )


def test_a_stalled_engine_times_out_and_is_not_used_again(model, tokenizer, prompts):
    engine = _engine(model, tokenizer, weight_sync_timeout_s=0.5)
    fake = FakeSGLangEngine.instances[0]
    fake.stall.set()
    start = time.monotonic()
    try:
        with pytest.raises(WeightSyncTimeout) as info:
            engine.update_weights(model.state_dict().items())
    finally:
        fake.stall.clear()
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert message.startswith(
        "actor_rollout_ref: weight sync to the sglang rollout engine timed out after 0.5 s"
    )
    assert "actor_rollout_ref.rollout.sglang.weight_sync_timeout_s=0.5" in message
    with pytest.raises(RuntimeError, match="SGLang rollout engine is unusable"):
        engine.generate(prompts, SamplingParams(n=1, do_sample=False, max_new_tokens=4))


def test_sleep_frees_the_kv_cache_and_generation_wakes_it(model, tokenizer, prompts):
    engine = _engine(model, tokenizer)
    fake = FakeSGLangEngine.instances[0]
    engine.sleep()
    engine.sleep()  # once asleep, a second call does nothing
    assert fake.released == {"kv_cache"}  # the weights stay: no push needed after waking
    engine.generate(prompts, SamplingParams(n=1, do_sample=False, max_new_tokens=4))
    names = [c[0] for c in fake.calls]
    assert names.count("release_memory_occupation") == 1
    assert names.index("resume_memory_occupation") < names.index("generate")
    model_dir = engine._model_dir
    assert (Path(model_dir) / "config.json").exists()
    engine.close()
    assert fake.shut_down and not Path(model_dir).exists()


def test_bad_engine_settings_fail_before_the_engine_starts(model, tokenizer):
    FakeSGLangEngine.instances.clear()
    with pytest.raises(ValueError, match="needs the tokenizer"):
        FakeBackedSGLang(model, None)
    with pytest.raises(ValueError, match="weight_sync_timeout_s=0 must be > 0"):
        FakeBackedSGLang(model, tokenizer, weight_sync_timeout_s=0)
    assert FakeSGLangEngine.instances == []


def test_trainer_pushes_before_the_generation_after_every_update_and_sleeps_around_it(
    tmp_path, tokenizer
):
    from verl.config import load_config
    from verl.models.tiny import save_tiny_model_dir
    from verl.rollout import register_rollout
    from verl.rollout.registry import ROLLOUT_BACKENDS
    from verl.trainer.rl.trainer import RLTrainer

    model_dir = save_tiny_model_dir(tmp_path / "model", arch="qwen2", tokenizer=tokenizer)
    register_rollout("test_sglang_fake", FakeBackedSGLang)
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.rollout.name=test_sglang_fake",
            "actor_rollout_ref.rollout.sglang.weight_sync_bucket_mb=0.1",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=2",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            "actor_rollout_ref.actor.entropy_coeff=0.05",  # the update moves the weights
            "data.train_batch_size=4",
            "data.max_response_length=6",
            "data.arithmetic.train_size=16",
            "data.arithmetic.val_size=4",
            "trainer.total_training_steps=2",
            "trainer.val_before_train=false",
            "trainer.logger=[]",
            "trainer.mixed_precision=none",  # fp32 weights pushed on any CPU (auto: bf16)
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            f"trainer.log_dir={tmp_path}",
        ]
    )
    FakeSGLangEngine.instances.clear()
    try:
        trainer = RLTrainer(cfg)
        trainer.fit()
    finally:
        ROLLOUT_BACKENDS.remove("test_sglang_fake")
    (fake,) = FakeSGLangEngine.instances
    events = [name for name, _ in fake.calls if name != "update_weights_from_tensor"]
    # start-up push, then step 1: wake, generate, sleep; each update's weights are pushed
    # lazily, right before the next generation (step 2's, then the validation's); then the
    # trainer's close shuts the engine down (the worker's close)
    push = ["flush_cache"]
    wake, sleep = "resume_memory_occupation", "release_memory_occupation"
    assert events == [
        *push,
        sleep,
        *[wake, "generate", sleep],
        *[wake, *push, "generate", sleep] * 2,
        "shutdown",
    ]
    assert all(tags == ["kv_cache"] for name, tags in fake.calls if name in (wake, sleep))
    actor = trainer.actor_rollout_wg.workers[0].engine.module
    for name, tensor in actor.state_dict().items():  # the engine holds the trained weights
        assert torch.equal(fake.model.state_dict()[name], tensor), name
    for metrics in trainer.history:  # step 2 sampled with the weights pushed after step 1
        assert metrics["actor/grad_norm"] > 0
        assert metrics["rollout/logprob_abs_diff_mean"] < 1e-5
    # an update reports the pushes since the previous one: step 2's generation pushed
    assert [m["rollout/weight_pushes"] for m in trainer.history] == [0.0, 1.0]
    assert 0 < trainer.history[1]["rollout/weight_sync_seconds"] < 30


def test_engine_runs_and_receives_weights_in_the_given_dtype(model, tokenizer, prompts):
    """dtype=bf16 (the actor computes in bf16): the engine starts in bf16 and the push casts
    the fp32 weights to bf16 as the engine takes them (buckets are still cut in fp32, as on
    the other ranks of a rank-0 engine)."""
    engine = _engine(model, tokenizer, dtype=torch.bfloat16, weight_sync_bucket_mb=0.05)
    fake = FakeSGLangEngine.instances[0]
    assert fake.server_args["dtype"] == "bfloat16" and engine.dtype_name == "bfloat16"
    assert next(fake.model.parameters()).dtype == torch.bfloat16
    fake.calls.clear()
    stats = engine.update_weights(model.state_dict().items())
    pushes = [c[1] for c in fake.calls if c[0] == "update_weights_from_tensor"]
    assert len(pushes) >= 3 and all(p["dtypes"] == {torch.bfloat16} for p in pushes)
    fp32_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert stats["megabytes"] == pytest.approx(fp32_bytes / 2**20)  # buckets cut in fp32
    out = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=8, seed=1))
    mask = out.batch["response_mask"].bool()
    gap = (_forward_log_probs(model, out, 1.0) - out.batch["rollout_log_probs"])[mask].abs()
    assert 1e-3 < float(gap.mean()) < 0.2  # sampled in bf16 (an fp32 engine: < 1e-5)


def test_serving_engines_take_the_actors_compute_precision():
    from verl.config import load_config
    from verl.workers.role_options import rollout_options

    def dtype_for(precision: str, rollout_cls=SGLangRollout):
        cfg = load_config(overrides=[f"trainer.mixed_precision={precision}"])
        return rollout_options(cfg, rollout_cls).get("dtype")

    assert dtype_for("bf16") is torch.bfloat16
    assert dtype_for("none") is None  # the weights' storage dtype (fp32 by default)
    assert dtype_for("fp32") is None
    assert dtype_for("bf16", NativeRollout) is None  # samples under the actor's autocast

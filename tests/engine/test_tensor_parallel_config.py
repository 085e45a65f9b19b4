"""The ``tensor_parallel_size`` keys: what validation refuses (with the key and the reason)
and how the keys reach the role specs' engine options. Fast: no model is built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl.config import ConfigError, load_config
from verl.utils.tensor_split import model_split_problem
from verl.workers.specs import actor_rollout_ref_spec, critic_spec

ACTOR = "actor_rollout_ref.actor.tensor_parallel_size"
TWO_RANKS = ("trainer.n_gpus_per_node=2", "trainer.device=cpu")


def messages(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    return [p.message for p in info.value.problems]


def _model_dir(tmp_path: Path, **config) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_the_keys_default_to_one_and_reach_the_engine_options():
    cfg = load_config(
        overrides=[*TWO_RANKS, f"{ACTOR}=2", "actor_rollout_ref.actor.use_kl_loss=true",
                   "algorithm.adv_estimator=gae", "critic.tensor_parallel_size=2"]
    )  # fmt: skip
    assert cfg.actor_rollout_ref.actor.tensor_parallel_size == 2
    assert load_config().critic.tensor_parallel_size == 1
    spec = actor_rollout_ref_spec(cfg, role="actor_rollout_ref")
    assert spec.actor.engine.tensor_parallel_size == 2
    assert spec.ref.engine.tensor_parallel_size == 2  # the reference follows the actor
    assert critic_spec(cfg).engine.tensor_parallel_size == 2


def test_a_size_that_does_not_divide_the_ranks_is_refused():
    (msg,) = messages([*TWO_RANKS, f"{ACTOR}=4"])
    assert msg == (
        f"{ACTOR}=4: tensor parallelism splits each layer over 4 ranks, which must divide "
        "the 2 ranks of actor_rollout_ref; use one of 1, 2"
    )


def test_the_single_engine_and_sequence_parallelism_are_refused():
    msgs = messages([f"{ACTOR}=2", "actor_rollout_ref.actor.strategy=single", "trainer.device=cpu"])
    assert (
        f"{ACTOR}=2: tensor parallelism needs the fsdp2 engine, but "
        + ("actor_rollout_ref.actor.strategy=single runs one process; use fsdp2 (or auto)")
        in msgs
    ), msgs
    msgs = messages(
        [*TWO_RANKS, f"{ACTOR}=2", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"]
    )
    assert any("a (data, sequence, tensor) mesh is not implemented" in m for m in msgs), msgs


def test_lora_weight_only_reference_agent_loops_and_distillation_are_refused():
    msgs = messages([*TWO_RANKS, f"{ACTOR}=2", "actor_rollout_ref.model.lora_rank=4"])
    assert any("LoRA adapters' layers have no tensor-parallel plan" in m for m in msgs), msgs
    msgs = messages(
        [*TWO_RANKS, f"{ACTOR}=2", "actor_rollout_ref.actor.use_kl_loss=true",
         "actor_rollout_ref.ref.precision=int4"]
    )  # fmt: skip
    assert any("the reference computes in int4, whose quantized linear" in m for m in msgs), msgs
    msgs = messages(
        [*TWO_RANKS, "critic.tensor_parallel_size=2", "algorithm.adv_estimator=gae",
         "critic.model.lora_rank=4"]
    )  # fmt: skip
    assert (
        "critic.tensor_parallel_size=2 with critic.model.lora_rank=4: the LoRA adapters' "
        "layers have no tensor-parallel plan; set one of them to 0 / 1"
    ) in msgs, msgs
    msgs = messages([*TWO_RANKS, f"{ACTOR}=2", "actor_rollout_ref.rollout.multi_turn.enable=true"])
    assert any("generate in lock step" in m for m in msgs), msgs
    load_config(overrides=[*TWO_RANKS, f"{ACTOR}=2", "actor_rollout_ref.rollout.name=hf"])
    msgs = messages([*TWO_RANKS, f"{ACTOR}=2", "actor_rollout_ref.rollout.name=vllm"])
    assert any("only the native and hf rollouts generate from the" in m for m in msgs), msgs
    msgs = messages(
        [*TWO_RANKS, f"{ACTOR}=2", "actor_rollout_ref.actor.use_kl_loss=true",
         "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2"]
    )  # fmt: skip
    assert any("the reference follows the actor's tensor parallelism" in m for m in msgs), msgs
    msgs = messages([*TWO_RANKS, f"{ACTOR}=2", "algorithm.distill.enable=true"])
    assert any("the teacher has no tensor-parallel layout" in m for m in msgs), msgs


def test_heads_that_do_not_split_are_refused_naming_the_models_counts(tmp_path):
    path = _model_dir(
        tmp_path, model_type="qwen2", num_attention_heads=6, num_key_value_heads=3,
        intermediate_size=128, vocab_size=640,
    )  # fmt: skip
    msgs = messages([*TWO_RANKS, f"{ACTOR}=2", f"actor_rollout_ref.model.path={path}"])
    assert msgs == [
        f"{ACTOR}=2: the model's key/value heads (3) cannot be split evenly over 2 tensor "
        f"ranks (it has 6 query / 3 key/value heads, intermediate size 128); use a {ACTOR} "
        "that divides 3: one of 1, 3"
    ]


def test_model_split_problem():
    ok = dict(model_type="llama", num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, vocab_size=640)  # fmt: skip
    assert model_split_problem(ok, "k", 2) is None
    assert model_split_problem({**ok, "num_attention_heads": 3}, "k", 2).startswith(
        "k=2: the model's query heads (3) cannot be split evenly over 2 tensor ranks (it has "
        "3 query / 2 key/value heads"
    )
    assert model_split_problem({**ok, "intermediate_size": 129}, "k", 2).startswith(
        "k=2: the model's intermediate size (129) cannot be split"
    )
    assert "has no tensor-parallel plan" in model_split_problem(
        {**ok, "model_type": "gpt2"}, "k", 2
    )


def test_a_sequence_classifier_is_refused_by_the_engine():
    from transformers import Qwen2ForSequenceClassification

    from verl.engine.tensor_parallel import TensorParallel, apply_tensor_parallel
    from verl.models.tiny import build_tiny_model

    classifier = Qwen2ForSequenceClassification(build_tiny_model().config)
    fake = TensorParallel(mesh=None, group=None, size=2, rank=0, dp_size=1, dp_rank=0)
    with pytest.raises(NotImplementedError, match="a sequence classifier is not supported"):
        apply_tensor_parallel(classifier, fake)

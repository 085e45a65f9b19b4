"""Memory-lean defaults of the RL trainer (issue 14, item 4): the reference is built only
when a KL term reads it, the native rollout samples from the training module itself (no
second copy of the weights), log-probs are chunked, micro-batches follow a token budget."""

from __future__ import annotations

import pytest

from verl.config import load_config
from verl.config.schema_roles import DEFAULT_TOKEN_BUDGET
from verl.trainer.rl.trainer import RLTrainer


def test_the_default_config_is_the_lean_one():
    cfg = load_config()
    actor = cfg.actor_rollout_ref.actor
    assert not actor.use_kl_loss and not cfg.algorithm.use_kl_in_reward
    assert cfg.ref_enabled is False
    assert cfg.actor_rollout_ref.rollout.name == "native"
    assert actor.logprob_chunk_size == 512 and actor.pack_sequences
    assert actor.uses_token_budget and actor.token_budget == DEFAULT_TOKEN_BUDGET


@pytest.mark.parametrize("kl", [False, True], ids=["no-kl", "kl-loss"])
def test_the_reference_is_loaded_only_with_a_kl_term(rl_config, kl):
    trainer = RLTrainer(rl_config(f"actor_rollout_ref.actor.use_kl_loss={str(kl).lower()}"))
    try:
        actor = trainer.actor_rollout_wg.workers[0]
        assert (actor.ref_engine is not None) is kl
        # the native rollout samples from the training module: one copy of the weights
        assert actor.rollout.module is actor.engine.module
        if kl:
            ref_params = {p.data_ptr() for p in actor.ref_engine.module.parameters()}
            assert ref_params.isdisjoint(p.data_ptr() for p in actor.engine.module.parameters())
    finally:
        trainer.close()

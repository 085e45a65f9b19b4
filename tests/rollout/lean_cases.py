"""What the lean forward's tests (bf16 and fp32) share: the sampling they run and the
comparison of two engines' outputs (same tokens, log-probs within a bound)."""

from __future__ import annotations

import torch

from verl.protocol import DataProto
from verl.rollout import SamplingParams

GREEDY = SamplingParams(n=2, do_sample=False, max_new_tokens=12)
SEEDED = SamplingParams(n=3, temperature=1.0, seed=11, max_new_tokens=12, stop_token_ids=[])


def assert_same_rollout(a: DataProto, b: DataProto, atol: float) -> None:
    """The same responses and masks, and rollout log-probs within ``atol``."""
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    assert torch.equal(a.batch["response_mask"], b.batch["response_mask"])
    torch.testing.assert_close(
        a.batch["rollout_log_probs"], b.batch["rollout_log_probs"], atol=atol, rtol=0
    )

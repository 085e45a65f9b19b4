"""A response that samples the model's image placeholder token ends before it
(verl.rollout.images.end_at_vision_placeholders), in the hf and native rollouts: without
the cut the training forward counts the sampled placeholder as an image slot and fails
("row i has 5 image tokens, which are not whole images of the grids given")."""

from __future__ import annotations

import pytest
import torch

from verl.kernels.torch_functional import compute_response_log_probs
from verl.models.tiny_vision import tiny_vision_model
from verl.rollout import SamplingParams, build_rollout
from verl.workers.vision_inputs import forward_inputs

RESPONSE = 6


@pytest.fixture(scope="module")
def placeholder_prone(vl):
    """The tiny Qwen2-VL with its image placeholder's logit raised by 5 (a hook on the
    head, so the rollout and the training passes see the same policy): about one sampled
    token in six is the placeholder."""
    model = tiny_vision_model(vl.processor, seed=0)
    image_id = model.config.image_token_id

    def raise_placeholder(_module, _args, logits):
        bias = torch.zeros(logits.shape[-1], dtype=logits.dtype, device=logits.device)
        bias[image_id] = 5.0
        return logits + bias

    model.lm_head.register_forward_hook(raise_placeholder)
    return model


@pytest.mark.parametrize("rollout", ["hf", "native"])
def test_a_sampled_image_placeholder_ends_the_response(vl, placeholder_prone, rollout):
    model = placeholder_prone
    image_id = model.config.image_token_id
    _, prompts = vl.prompts(4)
    engine = build_rollout(rollout, model, vl.processor.tokenizer)
    params = SamplingParams(
        n=4, temperature=1.0, max_new_tokens=RESPONSE, stop_token_ids=[], seed=5
    )
    gen = engine.generate(prompts, params)
    b = gen.batch
    mask = b["response_mask"].bool()
    lengths = mask.sum(-1)
    # no stop tokens: a response shorter than RESPONSE was cut at a placeholder
    assert int((lengths < RESPONSE).sum()) >= 4, lengths
    assert not bool((b["responses"][mask] == image_id).any())
    assert bool((b["responses"][~mask] == engine.pad_token_id).all())
    assert float(b["rollout_log_probs"][~mask].abs().sum()) == 0.0
    assert torch.equal(b["attention_mask"][:, -RESPONSE:].bool(), mask)
    assert torch.equal(b["input_ids"][:, -RESPONSE:], b["responses"])
    # the training passes take the batch, padded and packed, and agree with the rollout
    positions, inputs = forward_inputs(gen)
    for pack in (False, True):
        with torch.no_grad():
            lp, _ = compute_response_log_probs(
                model,
                b["input_ids"],
                b["attention_mask"],
                positions,
                response_len=RESPONSE,
                pack=pack,
                model_inputs=inputs,
            )
        diff = (lp - b["rollout_log_probs"])[mask].abs().max().item()
        assert diff < 1e-4, (pack, diff)

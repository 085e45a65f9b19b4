"""Ulysses sequence parallelism (``verl.kernels.ulysses``) on 2 gloo ranks against one process.

One spawned run: each rank holds the whole tiny model (no FSDP here: the raw forward and
backward), splits every batch's tokens over the 2-rank sequence group and computes
log-probs, entropies, a loss and its gradients. The per-rank parameter gradients are
``sp`` times each rank's partial gradient (what FSDP's average over ranks expects), so
their mean over the group must equal the one-process gradient. The test process computes
the one-process references and compares within 1e-5 (fp32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.ranks import run_ranks
from verl.kernels.torch_functional import compute_response_log_probs
from verl.models.tiny import build_tiny_model

WORLD = 2
PROMPT_LEN, RESPONSE_LEN = 7, 6
TOL = 1e-5
# (name, model kwargs, compute_response_log_probs kwargs)
CASES = (
    ("packed", {}, dict(pack=True)),
    ("padded", {}, dict(pack=False)),
    ("shared_prefix", {}, dict(pack=True, share_prefix=True)),
    # 1 key/value head for 2 sequence ranks: repeated
    ("kv_repeat", dict(num_heads=4, num_kv_heads=1), dict(pack=True)),
    ("untied_llama", dict(arch="llama", tie_word_embeddings=False), dict(pack=True)),
)


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded prompts (rows 0-1 and 2-3 share a prompt) + right-padded responses."""
    g = torch.Generator().manual_seed(11)
    rows = 6
    ids = torch.randint(3, 700, (rows, PROMPT_LEN + RESPONSE_LEN), generator=g)
    ids[1, :PROMPT_LEN] = ids[0, :PROMPT_LEN]
    ids[3, :PROMPT_LEN] = ids[2, :PROMPT_LEN]
    mask = torch.ones_like(ids)
    mask[2:4, :2] = 0  # a shared prompt with left padding
    mask[4, :3] = 0
    mask[0, -2:] = 0
    mask[3, -5:] = 0
    mask[5, -1:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos


def _run(model: torch.nn.Module, options: dict[str, Any]) -> dict[str, Any]:
    """Log-probs, entropies, a token-mean loss and the parameter gradients."""
    ids, mask, pos = _batch()
    model.zero_grad(set_to_none=True)
    log_probs, entropy = compute_response_log_probs(
        model, ids, mask, pos, RESPONSE_LEN, temperature=0.7, chunk_size=3,
        calculate_entropy=True, **options,
    )  # fmt: skip
    resp = mask[:, -RESPONSE_LEN:].float()
    loss = -((log_probs + 0.1 * entropy) * resp).sum() / resp.sum()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    resp_bool = resp.bool()
    return {
        "log_probs": log_probs.detach()[resp_bool],
        "entropy": entropy.detach()[resp_bool],
        "loss": loss.detach(),
        "grads": grads,
    }


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    import torch.distributed as dist

    from verl.kernels.ulysses import apply_ulysses, build_sequence_parallel
    from verl.utils.distributed import init_distributed

    init_distributed(rank, WORLD, "127.0.0.1", port, device_type="cpu", timeout_s=120)
    sp = build_sequence_parallel("cpu", WORLD)
    res: dict[str, Any] = {"sp": (sp.size, sp.rank, sp.dp_size, sp.dp_rank)}
    for name, model_kwargs, options in CASES:
        model = build_tiny_model(**model_kwargs)
        apply_ulysses(model, sp)
        out = _run(model, options)
        for grad in out["grads"].values():  # the group's mean: what FSDP's average gives
            dist.all_reduce(grad)
            grad /= WORLD
        with torch.no_grad():  # a scoring pass, as the old-log-prob pass runs it
            out["no_grad_log_probs"], _ = compute_response_log_probs(
                model, *_batch(), RESPONSE_LEN, temperature=0.7, **options
            )
        res[name] = out
    torch.save(res, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory, request) -> list[dict[str, Any]]:
    from verl.utils.distributed import find_free_port

    out_dir = tmp_path_factory.mktemp("ulysses")
    run_ranks(_worker, (find_free_port(), str(out_dir)), WORLD, request)
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(WORLD)]


def test_mesh_places_both_ranks_in_one_sequence_group(results):
    assert [r["sp"] for r in results] == [(2, 0, 1, 0), (2, 1, 1, 0)]


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_sequence_parallel_equals_one_process(results, name):
    model_kwargs, options = next((m, o) for n, m, o in CASES if n == name)
    ref = _run(build_tiny_model(**model_kwargs), options)
    for rank, res in enumerate(results):
        got = res[name]
        for key in ("log_probs", "entropy", "loss"):
            torch.testing.assert_close(got[key], ref[key], atol=TOL, rtol=0, msg=f"{key} r{rank}")
        mask = _batch()[1][:, -RESPONSE_LEN:].bool()
        torch.testing.assert_close(
            got["no_grad_log_probs"][mask], ref["log_probs"], atol=TOL, rtol=0
        )
        assert got["grads"].keys() == ref["grads"].keys()
        for key, grad in ref["grads"].items():
            assert grad.abs().max() > 0, key
            torch.testing.assert_close(got["grads"][key], grad, atol=TOL, rtol=0, msg=key)


def test_head_split_errors_name_the_counts():
    from types import SimpleNamespace

    from verl.kernels.ulysses import check_heads

    check_heads(SimpleNamespace(num_attention_heads=4, num_key_value_heads=2), 2)
    check_heads(SimpleNamespace(num_attention_heads=8, num_key_value_heads=2), 4)  # kv repeat
    with pytest.raises(ValueError, match="3 attention heads do not split over 2"):
        check_heads(SimpleNamespace(num_attention_heads=3, num_key_value_heads=3), 2)
    with pytest.raises(ValueError, match="6 key/value heads neither split over 4"):
        check_heads(SimpleNamespace(num_attention_heads=12, num_key_value_heads=6), 4)


def test_padded_blocks_cover_each_rows_real_tokens():
    from verl.kernels.ulysses import padded_blocks

    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    assert padded_blocks(mask) == [(1, 3, 0, 0), (5, 5, 0, 0)]
    with pytest.raises(ValueError, match="rows \\[0\\]"):
        padded_blocks(torch.tensor([[1, 0, 1]]))


def test_config_refuses_a_size_that_does_not_divide_the_ranks_or_the_single_engine(tmp_path):
    from verl.config import ConfigError, load_config
    from verl.models.tiny import save_tiny_model_dir

    model = save_tiny_model_dir(tmp_path / "model", arch="qwen2")
    key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    base = [f"actor_rollout_ref.model.path={model}", "trainer.device=cpu"]
    cfg = load_config(overrides=[*base, "trainer.n_gpus_per_node=4", f"{key}=2"])
    assert cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size == 2
    assert cfg.actor_rollout_ref.ref.ulysses_sequence_parallel_size is None  # as the actor's
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[*base, "trainer.n_gpus_per_node=2", f"{key}=4"])
    assert f"{key}=4: sequence parallelism splits each micro-batch over 4 ranks" in str(err.value)
    assert "must divide the 2 ranks of actor_rollout_ref; use one of 1, 2" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config(
            overrides=[
                *base,
                "trainer.n_gpus_per_node=2",
                "critic.enable=true",
                "algorithm.adv_estimator=gae",
                "critic.strategy=single",
                "critic.ulysses_sequence_parallel_size=2",
            ]
        )
    assert "critic.ulysses_sequence_parallel_size=2: sequence parallelism needs the fsdp2" in str(
        err.value
    )


def test_the_single_engine_refuses_sequence_parallelism():
    from verl.engine import build_engine

    with pytest.raises(ValueError, match="ulysses_sequence_parallel_size=2 needs the fsdp2"):
        build_engine("single", build_tiny_model(), None, sequence_parallel_size=2)


def test_an_unsupported_model_is_refused_before_sharding():
    from types import SimpleNamespace

    from verl.kernels.ulysses import _check_model

    config = SimpleNamespace(model_type="gemma2", num_attention_heads=4)
    with pytest.raises(NotImplementedError, match="model_type='gemma2' is not supported"):
        _check_model(config, 2)
    config = SimpleNamespace(
        model_type="qwen2", num_attention_heads=4, sliding_window=16, use_sliding_window=True
    )
    with pytest.raises(NotImplementedError, match="sliding-window attention"):
        _check_model(config, 2)
    config = SimpleNamespace(
        model_type="qwen2",
        num_attention_heads=4,
        num_key_value_heads=2,
        _attn_implementation="eager",
    )
    with pytest.raises(NotImplementedError, match="attn_implementation='eager'"):
        _check_model(config, 2)

"""The actor, reference and critic workers with Ulysses sequence parallelism on 2 gloo ranks.

Each spawned rank builds the workers as a worker group would (``RANK`` / ``WORLD_SIZE`` in
the environment, the process group joined first, fsdp2 engines with
``ulysses_sequence_parallel_size=2``) and calls their methods with its dispatch chunk of a
fixed batch: the old- and reference log-prob passes, the actor update, the value pass and
the critic update. The test process runs the same methods in one process on the whole
batch; outputs, metrics and the gradients each optimizer step receives must agree within
1e-5 (fp32): packed (rows sharing a prompt: shared-prompt packing), padded, and packed
with LoRA, activation checkpointing and token-budget micro-batches.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.ranks import run_ranks
from verl.config import load_config
from verl.models import CausalLMWithValueHead
from verl.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny_model_dir
from verl.protocol import DataProto
from verl.workers.specs import actor_rollout_ref_spec, critic_spec

WORLD = 2
P, R = 6, 5
PROMPT_LENS = [6, 2, 6, 3, 5, 1]
RESPONSE_LENS = [5, 3, 1, 0, 4, 2]
ROWS = len(PROMPT_LENS)
TOL = 1e-5
# name -> extra overrides of both roles' configs
VARIANTS = {
    "packed": (),
    "padded": (
        "actor_rollout_ref.actor.pack_sequences=false",
        "critic.pack_sequences=false",
    ),
    "lora_checkpointing_budget": (
        "actor_rollout_ref.model.lora_rank=4",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        "critic.model.enable_gradient_checkpointing=true",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        # per device: a 2-rank sequence group's micro-batches hold up to 48 tokens, as the
        # one-process reference's (_config doubles it there)
        "actor_rollout_ref.actor.ppo_max_token_len_per_device=24",
    ),
}


def _inputs() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 200, (ROWS, P + R), generator=gen)
    ids[1, :P] = ids[0, :P]  # rows 0 and 2 share their prompt (6 tokens each)
    ids[2, :P] = ids[0, :P]
    mask = torch.zeros(ROWS, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS, strict=True)):
        mask[i, P - p : P + r] = 1
    ids = ids * mask
    noise = torch.randn(3, ROWS, R, generator=gen)
    response_mask = mask[:, P:].float()
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp_min(0),
        "response_mask": response_mask,
        "advantages": noise[0] * response_mask,
        "returns": noise[1] * response_mask,
        "noise": 0.05 * noise[2],
    }


def _config(model_dir: str, ranks: int, variant: str, rank: int = 0):
    """The config of ``rank`` (one ``trainer.seed`` for all: LoRA adapters are drawn from it
    alone, so every rank initialises the adapters one process would, then keeps its shard)."""
    a, c = "actor_rollout_ref.actor", "critic"
    sp = (
        [f"{a}.ulysses_sequence_parallel_size={ranks}", f"{c}.ulysses_sequence_parallel_size={ranks}"]
        if ranks > 1
        else [f"{a}.strategy=fsdp2", f"{c}.strategy=fsdp2"]
    )  # fmt: skip
    return load_config(
        overrides=[
            f"actor_rollout_ref.model.path={model_dir}",
            "algorithm.adv_estimator=gae",
            "trainer.device=cpu",
            "trainer.mixed_precision=none",
            f"trainer.n_gpus_per_node={ranks}",
            "trainer.seed=1",
            "data.train_batch_size=3",
            f"data.max_prompt_length={P}",
            f"data.max_response_length={R}",
            "actor_rollout_ref.rollout.n=2",
            f"{a}.ppo_mini_batch_size=3",
            f"{a}.ppo_micro_batch_size_per_device=3",
            f"{a}.shuffle=false",
            f"{a}.entropy_coeff=0.01",
            f"{a}.use_kl_loss=true",
            f"{a}.kl_loss_coef=0.1",
            f"{a}.logprob_chunk_size=3",
            f"{c}.ppo_mini_batch_size=3",
            f"{c}.ppo_micro_batch_size_per_device=3",
            f"{c}.shuffle=false",
            *sp,
            *(
                x.replace("_per_device=24", "_per_device=48") if ranks == 1 else x
                for x in VARIANTS[variant]
            ),
        ]
    )


def _full_grads(engine) -> list:
    """Record the (unsharded) gradients each optimizer step receives."""
    captured = []
    step = engine.optimizer_step

    def recording_step():
        grads = []
        for p in engine.module.parameters():
            if p.grad is None:
                continue
            g = p.grad
            grads.append((g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone())
        captured.append(grads)
        return step()

    engine.optimizer_step = recording_step
    return captured


def _run(cfg, rows: slice) -> dict[str, Any]:
    """The workers' passes on ``rows`` of the batch, as one rank of a group runs them."""
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
    from verl.workers.critic import CriticWorker

    torch.manual_seed(0)
    t = _inputs()
    seq = {k: t[k][rows] for k in ("input_ids", "attention_mask", "position_ids", "response_mask")}
    data = DataProto.from_dict(tensors=seq, meta_info={"temperature": 0.8})
    out: dict[str, Any] = {}
    tok = build_tiny_tokenizer()
    actor = ActorRolloutRefWorker(
        actor_rollout_ref_spec(cfg, role="actor_rollout_ref"),
        module=build_tiny_model(),
        tokenizer=tok,
    )
    actor.init_model(total_steps=2)
    actor_grads = _full_grads(actor.engine)
    old = actor.compute_log_prob(data)
    ref = actor.compute_ref_log_prob(data)
    out["old_log_probs"], out["entropys"] = old.batch["old_log_probs"], old.batch["entropys"]
    out["ref_log_probs"] = ref.batch["ref_log_probs"]
    update = data.union(
        DataProto.from_dict(
            tensors={
                "old_log_probs": old.batch["old_log_probs"] + t["noise"][rows],
                "ref_log_probs": ref.batch["ref_log_probs"],
                "advantages": t["advantages"][rows],
            }
        )
    )
    out["actor_metrics"] = actor.update_actor(update)
    out["actor_grads"] = actor_grads
    critic = CriticWorker(
        critic_spec(cfg), module=CausalLMWithValueHead(build_tiny_model()), tokenizer=tok
    )
    critic.init_model(total_steps=2)
    critic_grads = _full_grads(critic.engine)
    values = critic.compute_values(data).batch["values"]
    out["values"] = values
    critic_data = data.union(
        DataProto.from_dict(
            tensors={"values": values + t["noise"][rows], "returns": t["returns"][rows]}
        )
    )
    out["critic_metrics"] = critic.update_critic(critic_data)
    out["critic_grads"] = critic_grads
    out["values_after"] = critic.compute_values(data).batch["values"]
    return out


def _worker(rank: int, port: int, model_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    import torch.distributed as dist

    from verl.utils.distributed import init_distributed

    init_distributed(rank, WORLD, "127.0.0.1", port, device_type="cpu", timeout_s=300)
    chunk = ROWS // WORLD
    res = {
        variant: _run(
            _config(model_dir, WORLD, variant, rank), slice(rank * chunk, (rank + 1) * chunk)
        )
        for variant in VARIANTS
    }
    torch.save(res, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(save_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", arch="qwen2"))


@pytest.fixture(scope="module")
def results(tmp_path_factory, model_dir, request) -> list[dict[str, Any]]:
    from verl.utils.distributed import find_free_port

    out_dir = tmp_path_factory.mktemp("ulysses_workers")
    run_ranks(_worker, (find_free_port(), model_dir, str(out_dir)), WORLD, request)
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(WORLD)]


def _close(got, want, what: str) -> None:
    worst = float((got - want).abs().max()) if got.numel() else 0.0
    assert worst <= TOL, f"{what}: differs by {worst:.3g} > {TOL}"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_workers_with_sequence_parallelism_equal_one_process(results, model_dir, variant):
    from verl.workers.common import release_private_process_group

    try:  # the one-process reference: FSDP2 workers on a private one-rank group
        want = _run(_config(model_dir, 1, variant), slice(0, ROWS))
    finally:
        release_private_process_group()
    mask = _inputs()["response_mask"].bool()
    for key in ("old_log_probs", "entropys", "ref_log_probs", "values", "values_after"):
        got = torch.cat([r[variant][key] for r in results])
        _close(got[mask], want[key][mask], key)
    for role in ("actor", "critic"):
        for rank, res in enumerate(results):
            got = res[variant][f"{role}_metrics"]
            for key, value in want[f"{role}_metrics"].items():
                assert abs(got[key] - value) <= TOL * max(1.0, abs(value)), (rank, key)
            (got_grads,), (want_grads,) = res[variant][f"{role}_grads"], want[f"{role}_grads"]
            assert len(got_grads) == len(want_grads)
            for i, (g, w) in enumerate(zip(got_grads, want_grads, strict=True)):
                _close(g, w, f"{role} grad {i} rank {rank}")
            assert max(float(w.abs().max()) for w in want_grads) > 1e-4
    assert want["actor_metrics"]["actor/grad_norm"] > 0

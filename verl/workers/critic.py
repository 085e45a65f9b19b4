"""The critic worker: a value model (LM backbone + scalar head) with its own engine.

The worker reads a :class:`~verl.workers.specs.CriticSpec`
(:func:`verl.workers.specs.critic_spec`); its value loss is bound once at set-up
(:func:`verl.workers.losses.bind_value_loss`) and called with each micro-batch's tensors.

Ulysses sequence parallelism (``critic.ulysses_sequence_parallel_size``): the value and
update passes join the batch slices of a sequence group's ranks
(``verl.workers.common.sequence_group_batch``) and split each sequence's tokens over them
(``verl.kernels.torch_functional.sequence_parallel_inputs``). Tensor parallelism
(``critic.tensor_parallel_size``): the ranks of a tensor group join their slices the same
way and compute them together, each with its share of the body's weights (the value head is
replicated, ``verl.engine.tensor_parallel``).

LoRA (``critic.model.lora_rank > 0``, :func:`verl.models.lora.apply_lora_to_value_model`):
adapters in the body, trained with the whole value head; the body's weights stay frozen.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from verl.controller import Dispatch, Worker, register
from verl.engine import OptimSpec, build_engine
from verl.kernels.packed_model import (
    pack_batch,
    packed_forward,
    sequence_parallel_inputs,
    supports_packing,
)
from verl.kernels.ulysses import sequence_parallel_of
from verl.models import (
    CausalLMWithValueHead,
    check_vocab_covers_tokenizer,
    checkpoint_if_configured,
    resolve_dtype,
)
from verl.models.lora import apply_lora_to_value_model, is_lora_model
from verl.models.precision import attention_implementation
from verl.protocol import DataProto
from verl.utils.device import resolve_device
from verl.utils.rng import seed_all
from verl.workers.checkpointing import load_worker_checkpoint, save_role_checkpoint
from verl.workers.common import (
    ensure_process_group,
    micro_batches,
    run_ppo_update,
    save_critic_model,
    sequence_group_batch,
    sequence_parallel_size,
    to_device,
)
from verl.workers.losses import bind_value_loss
from verl.workers.micro_batching import MicroBatch, gather_response_outputs
from verl.workers.specs import CriticSpec, check_spec

logger = logging.getLogger(__name__)

# The data contract (verl.controller.dispatch.register): what each method reads.
_SEQUENCE_KEYS = ("input_ids", "attention_mask", "position_ids", "response_mask")


def _response_values(
    module: torch.nn.Module, mb: DataProto, response_len: int, batching: Any = None
) -> torch.Tensor:
    """Values of the states that produced each response token, ``(batch, response_len)``.

    The value for response token ``t`` is read at the position just before it (the state
    in which the policy chose it), i.e. positions ``[-response_len - 1, -1)``. With
    ``batching.pack_sequences`` (the critic's :class:`~verl.workers.specs.BatchingSpec`; and a
    body whose model type packs, ``supports_packing``) the model runs on the real tokens
    packed end to end (``batching.share_prompt_prefix``: each prompt group's prompt once);
    padded positions are then 0.
    """
    b = mb.batch
    body = getattr(module, "model", None)
    sp = sequence_parallel_of(module)
    if sp is not None:  # this rank computes 1/sp of the tokens (verl.kernels.ulysses)
        pack = batching is not None and batching.pack_sequences
        share = pack and batching.share_prompt_prefix
        shard, _, place = sequence_parallel_inputs(
            module,
            sp,
            b["input_ids"],
            b["attention_mask"],
            b["position_ids"],
            response_len,
            pack,
            share,
        )
        with shard.forward_kwargs() as kwargs:  # the module's forward: FSDP2's hooks
            values = module(input_ids=shard.input_ids, **kwargs)
        return place(shard.gather(shard.select(values).float()))
    if batching is not None and batching.pack_sequences and supports_packing(body):
        packed = pack_batch(
            body, b["input_ids"], b["attention_mask"], response_len, batching.share_prompt_prefix
        )
        # through the module's own forward (FSDP2 gathers the value head in its hooks)
        with packed_forward(body, packed) as kwargs:
            values = module(input_ids=packed.input_ids, **kwargs)
        mask = packed.response_mask
        flat = values.reshape(-1)[packed.response_index].float()
        return flat.new_zeros(mask.shape).masked_scatter(mask, flat)
    values = module(
        input_ids=b["input_ids"],
        attention_mask=b["attention_mask"],
        position_ids=b["position_ids"],
    )
    return values[:, -response_len - 1 : -1].float()


class CriticWorker(Worker):
    """Value model for GAE. ``critic.model.path`` defaults to the actor's model path.

    Args:
        spec: what the worker reads (:func:`verl.workers.specs.critic_spec`).
        module: an already-built value model to use instead of loading ``model.path``.
        tokenizer: the policy's tokenizer (checked against the model's vocabulary).
    """

    def __init__(
        self,
        spec: CriticSpec,
        module: torch.nn.Module | None = None,
        tokenizer: Any = None,
        **worker_kwargs: Any,
    ) -> None:
        super().__init__(**worker_kwargs)
        check_spec(spec, CriticSpec, "critic_spec")
        # Every process draws reproducible random numbers (see verl.utils.rng.seed_all).
        seed_all(spec.seed + self.rank)
        self.spec = spec
        self.tokenizer = tokenizer
        self._given_module = module
        self.device = resolve_device(spec.device, self.local_rank or 0)
        self.engine = None
        self.value_loss = None  # the value loss, bound from the spec at set-up
        self._update_calls = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_steps: int) -> None:
        spec = self.spec
        module = self._given_module
        if module is None:
            module = CausalLMWithValueHead.from_pretrained(
                spec.model.path,
                dtype=resolve_dtype(spec.model.dtype),
                trust_remote_code=spec.model.trust_remote_code,
                override_config=spec.model.override_config,
                attn_implementation=attention_implementation(spec.use_flash_attention, self.device),
            )
        self._given_module = None
        check_vocab_covers_tokenizer(module, self.tokenizer, "critic.model")
        if spec.model.lora is not None:
            module = apply_lora_to_value_model(module, spec.model.lora, seed=spec.seed)
        checkpoint_if_configured(
            module,
            spec.model.gradient_checkpointing,
            spec.checkpoint_tokens,
            "critic.model.enable_gradient_checkpointing",
        )
        optim = OptimSpec.from_config(spec.optim, total_steps=total_steps)
        if spec.strategy == "fsdp2":
            ensure_process_group(self.rank, self.world_size, self.device.type)
        self.engine = build_engine(
            spec.strategy, module, optim, spec.engine.replace(device=self.device)
        )
        self.value_loss = bind_value_loss(spec.loss)

    @register(dispatch_mode=Dispatch.DP_COMPUTE, reads=_SEQUENCE_KEYS)
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` ``(batch, response_len)`` of the current critic, masked to 0."""
        batching = self.spec.batching
        response_len = data.batch["response_mask"].shape[1]
        mbs = self.spec.forward_micro_batch_size  # None: as the update
        data, rows = sequence_group_batch(self.engine, data)
        out = []
        inputs = to_device(
            data.select(batch_keys=["input_ids", "attention_mask", "position_ids"]), self.device
        )
        with torch.no_grad(), self.engine.eval_mode(), self.engine.autocast():
            sp_size = sequence_parallel_size(self.engine)
            for mb in micro_batches(inputs, response_len, mbs, batching, sp_size):
                values = _response_values(self.engine.module, mb.data, mb.response_len, batching)
                out.append((mb, values.float().cpu()))
        values = gather_response_outputs(out, len(data), response_len) * data.batch["response_mask"]
        return DataProto.from_dict(tensors={"values": values[rows]})

    @register(dispatch_mode=Dispatch.DP_COMPUTE, reads=(*_SEQUENCE_KEYS, "values", "returns"))
    def update_critic(self, data: DataProto) -> dict[str, float]:
        """Clipped value-loss regression onto ``returns``; returns the metrics (reduced
        over the data-parallel ranks).

        The loss is :func:`verl.algorithms.critic_loss`, bound at set-up
        (:func:`verl.workers.losses.bind_value_loss`); the loop (epochs, mini-batches,
        weighted micro-batches) is :func:`verl.workers.common.run_ppo_update`.
        """
        batching, value_loss = self.spec.batching, self.value_loss
        self._update_calls += 1
        # the rows of this rank's sequence group (its own rows without sequence parallelism)
        data, _ = sequence_group_batch(self.engine, data)

        def loss_fn(module: torch.nn.Module, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
            vpreds = _response_values(module, mb.data, mb.response_len, batching)
            return value_loss(vpreds, mb.data.batch)

        acc = run_ppo_update(
            self.engine,
            data.select(batch_keys=[*_SEQUENCE_KEYS, "values", "returns"]),
            loss_fn,
            batching=batching,
            # ppo_mini_batch_size counts prompts over all data-parallel ranks (sequence groups)
            mini_batch_size=batching.mini_batch_size(
                getattr(self.engine, "data_parallel_size", self.world_size)
            ),
            seed=self.spec.seed + 7919 * self._update_calls,
            device=self.device,
            prefix="critic",
        )
        return acc.result()

    # ------------------------------------------------------------------ checkpoints
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(
        self, path: str, hf_config_dir: str | None = None, hf_weights: bool = False
    ) -> None:
        """Write this rank's share of a run checkpoint (a collective under FSDP2): the critic
        engine, this rank's RNG and update counter; rank 0 writes the body's HF config (and
        tokenizer) to ``hf_config_dir`` for ``verl.cli.export --role critic``, or with
        ``hf_weights`` (``save_contents`` has ``hf_model``) the whole critic as that export
        writes it (body + ``value_head.safetensors``; not for a LoRA critic)."""
        save_role_checkpoint(
            self.engine,
            self.tokenizer,
            path,
            rank=self.rank,
            world_size=self.world_size,
            counters={"update_calls": self._update_calls},
            hf_config_dir=hf_config_dir,
            write_hf_model=self._write_hf_model if hf_weights else None,
        )

    def _write_hf_model(self, hf_config_dir: str | None) -> None:
        if hf_config_dir is None or is_lora_model(self.engine.module):
            raise ValueError("hf_weights needs hf_config_dir and a critic without LoRA")
        sharded = self.spec.strategy == "fsdp2"
        state = self.engine.state_dict_for_save() if sharded else None
        if self.rank == 0:
            save_critic_model(self.engine.module, self.tokenizer, hf_config_dir, state)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote (a collective under FSDP2)."""
        counters = load_worker_checkpoint(
            self.engine, path, rank=self.rank, world_size=self.world_size
        )
        self._update_calls = counters["update_calls"]

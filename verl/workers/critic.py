"""The critic worker: a value model (LM backbone + scalar head) with its own engine.

Ulysses sequence parallelism (``critic.ulysses_sequence_parallel_size``): the value and
update passes join the batch slices of a sequence group's ranks
(``verl.workers.common.sequence_group_batch``) and split each sequence's tokens over them
(``verl.kernels.torch_functional.sequence_parallel_inputs``).

LoRA (``critic.model.lora_rank > 0``, :func:`verl.models.lora.apply_lora_to_value_model`):
adapters in the body, trained with the whole value head; the body's weights stay frozen.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from verl.algorithms.losses import critic_loss
from verl.config import TrainerConfig
from verl.controller import Dispatch, Worker, register
from verl.engine import OptimSpec, build_engine
from verl.kernels.torch_functional import (
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
from verl.models.lora import (
    apply_lora_to_value_model,
    is_lora_model,
    lora_config_of,
    lora_spec_from_config,
)
from verl.models.precision import attention_implementation
from verl.protocol import DataProto
from verl.utils.device import resolve_device
from verl.utils.rng import seed_all
from verl.workers.checkpointing import (
    load_worker_checkpoint,
    save_hf_metadata,
    save_worker_checkpoint,
)
from verl.workers.common import (
    engine_options,
    micro_batches,
    precision_options,
    run_ppo_update,
    save_critic_model,
    sequence_group_batch,
    sequence_parallel_size,
    to_device,
)
from verl.workers.micro_batching import MicroBatch, gather_response_outputs

logger = logging.getLogger(__name__)

# The data contract (verl.controller.dispatch.register): what each method reads.
_SEQUENCE_KEYS = ("input_ids", "attention_mask", "position_ids", "response_mask")


def _response_values(
    module: torch.nn.Module, mb: DataProto, response_len: int, ccfg: Any = None
) -> torch.Tensor:
    """Values of the states that produced each response token, ``(batch, response_len)``.

    The value for response token ``t`` is read at the position just before it (the state
    in which the policy chose it), i.e. positions ``[-response_len - 1, -1)``. With
    ``ccfg.pack_sequences`` (and a body whose model type packs, ``supports_packing``) the
    model runs on the real tokens packed end to end (``ccfg.share_prompt_prefix``: each
    prompt group's prompt once); padded positions are then 0.
    """
    b = mb.batch
    body = getattr(module, "model", None)
    sp = sequence_parallel_of(module)
    if sp is not None:  # this rank computes 1/sp of the tokens (verl.kernels.ulysses)
        pack = ccfg is not None and ccfg.pack_sequences
        share = pack and ccfg.share_prompt_prefix
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
    if ccfg is not None and ccfg.pack_sequences and supports_packing(body):
        packed = pack_batch(
            body, b["input_ids"], b["attention_mask"], response_len, ccfg.share_prompt_prefix
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
    """Value model for GAE. ``critic.model.path`` defaults to the actor's model path."""

    def __init__(
        self,
        config: TrainerConfig,
        module: torch.nn.Module | None = None,
        tokenizer: Any = None,
        **worker_kwargs: Any,
    ) -> None:
        super().__init__(**worker_kwargs)
        # Every process draws reproducible random numbers (see verl.utils.rng.seed_all).
        seed_all(config.trainer.seed + self.rank)
        self.config = config
        self.tokenizer = tokenizer
        self._given_module = module
        self.device = resolve_device(config.trainer.device, self.local_rank or 0)
        self.engine = None
        self._update_calls = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_steps: int) -> None:
        ccfg = self.config.critic
        module = self._given_module
        if module is None:
            path = ccfg.model.path or self.config.actor_rollout_ref.model.path
            module = CausalLMWithValueHead.from_pretrained(
                path,
                dtype=resolve_dtype(ccfg.model.dtype),
                trust_remote_code=self.config.actor_rollout_ref.model.trust_remote_code,
                override_config=ccfg.model.override_config,
                attn_implementation=attention_implementation(
                    self.config.trainer.use_flash_attention, self.device
                ),
            )
        self._given_module = None
        check_vocab_covers_tokenizer(module, self.tokenizer, "critic.model")
        lora = lora_spec_from_config(ccfg.model)
        if lora is not None:
            module = apply_lora_to_value_model(module, lora, seed=self.config.trainer.seed)
        data = self.config.data
        checkpoint_if_configured(
            module,
            ccfg.model.enable_gradient_checkpointing,
            ccfg.max_update_tokens(data.max_prompt_length, data.max_response_length),
            "critic.model.enable_gradient_checkpointing",
        )
        strategy = self.config.engine_strategy("critic")
        self.engine = build_engine(
            strategy,
            module=module,
            optim=OptimSpec.from_config(ccfg.optim, total_steps=total_steps),
            grad_clip=ccfg.grad_clip,
            device=self.device,
            **precision_options(
                self.config,
                "critic",
                strategy,
                engine_options(
                    self, strategy, ccfg.fsdp_config, ccfg.ulysses_sequence_parallel_size
                ),
            ),
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE, reads=_SEQUENCE_KEYS)
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` ``(batch, response_len)`` of the current critic, masked to 0."""
        ccfg = self.config.critic
        response_len = data.batch["response_mask"].shape[1]
        mbs = ccfg.forward_micro_batch_size_per_device  # None: as the update
        data, rows = sequence_group_batch(self.engine, data)
        out = []
        inputs = to_device(
            data.select(batch_keys=["input_ids", "attention_mask", "position_ids"]), self.device
        )
        with torch.no_grad(), self.engine.eval_mode(), self.engine.autocast():
            sp_size = sequence_parallel_size(self.engine)
            for mb in micro_batches(inputs, response_len, mbs, ccfg, sp_size):
                values = _response_values(self.engine.module, mb.data, mb.response_len, ccfg)
                out.append((mb, values.float().cpu()))
        values = gather_response_outputs(out, len(data), response_len) * data.batch["response_mask"]
        return DataProto.from_dict(tensors={"values": values[rows]})

    @register(dispatch_mode=Dispatch.DP_COMPUTE, reads=(*_SEQUENCE_KEYS, "values", "returns"))
    def update_critic(self, data: DataProto) -> dict[str, float]:
        """Clipped value-loss regression onto ``returns``; returns the metrics (reduced
        over the data-parallel ranks).

        The loss is :func:`verl.algorithms.critic_loss`; the loop (epochs, mini-batches,
        weighted micro-batches) is :func:`verl.workers.common.run_ppo_update`.
        """
        ccfg = self.config.critic
        self._update_calls += 1
        # the rows of this rank's sequence group (its own rows without sequence parallelism)
        data, _ = sequence_group_batch(self.engine, data)

        def loss_fn(module: torch.nn.Module, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
            b = mb.data.batch
            return critic_loss(
                _response_values(module, mb.data, mb.response_len, ccfg),
                b["values"],
                b["returns"],
                b["response_mask"],
                cliprange_value=ccfg.cliprange_value,
                loss_agg_mode=ccfg.loss_agg_mode,
                loss_coef=ccfg.loss_coef,
                # a constant, as the actor's: not each micro-batch's trimmed width
                loss_scale_factor=self.config.data.max_response_length,
            )

        acc = run_ppo_update(
            self.engine,
            data.select(batch_keys=[*_SEQUENCE_KEYS, "values", "returns"]),
            loss_fn,
            role_cfg=ccfg,
            # ppo_mini_batch_size counts prompts over all data-parallel ranks (sequence groups)
            mini_batch_size=ccfg.ppo_mini_batch_size
            * self.config.actor_rollout_ref.rollout.n
            // getattr(self.engine, "data_parallel_size", self.world_size),
            seed=self.config.trainer.seed + 7919 * self._update_calls,
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
        save_worker_checkpoint(
            self.engine,
            path,
            rank=self.rank,
            world_size=self.world_size,
            counters={"update_calls": self._update_calls},
        )
        if hf_weights:
            if hf_config_dir is None or is_lora_model(self.engine.module):
                raise ValueError("hf_weights needs hf_config_dir and a critic without LoRA")
            sharded = self.config.engine_strategy("critic") == "fsdp2"
            state = self.engine.state_dict_for_save() if sharded else None
            if self.rank == 0:
                save_critic_model(self.engine.module, self.tokenizer, hf_config_dir, state)
        elif hf_config_dir is not None and self.rank == 0:
            save_hf_metadata(self.engine.module, self.tokenizer, hf_config_dir)
            if is_lora_model(self.engine.module):  # export folds the adapters in (model_merger)
                lora_config_of(self.engine.module).save_pretrained(hf_config_dir)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote (a collective under FSDP2)."""
        counters = load_worker_checkpoint(
            self.engine, path, rank=self.rank, world_size=self.world_size
        )
        self._update_calls = counters["update_calls"]

"""The hybrid actor / rollout / reference worker.

One worker process per device holds the actor's train engine and a rollout engine that
samples from the *same* module (no second copy of the weights), plus, when a KL term is
used, a frozen reference copy of the initial policy in an inference-only engine. The
worker only translates ``DataProto`` batches into engine calls; the algorithm lives in the
trainer and in ``verl.algorithms``.

Hybrid engine: with the ``fsdp2`` engine each rank holds a shard of the actor. Generation
runs inside ``engine.gathered_params()``, which unshards the parameters once for the whole
generation (instead of per forward) and reshards them afterwards, so the rollout reads
the training weights in place and a second resident copy never exists. Data-parallel
ranks each generate, score and update their own slice of the batch (``DP_COMPUTE``); loss
weights are global (``verl.workers.common.micro_batch_weights``). With Ulysses sequence
parallelism (``actor.ulysses_sequence_parallel_size``, ``ref.ulysses_sequence_parallel_size``)
the scoring and update passes first join the slices of the ranks of a sequence group
(``verl.workers.common.sequence_group_batch``), which then compute them together, each on
a share of every sequence's tokens; generation stays per rank. With tensor parallelism
(``actor.tensor_parallel_size``, followed by the reference) the ranks of a tensor group join
their slices the same way for every pass, generation included
(``verl.workers.common.join_in_group``), and compute them together, each with its
share of every layer's weights.

LoRA (``model.lora_rank > 0``, :mod:`verl.models.lora`): the actor is a ``PeftModel`` whose
adapters alone train; the reference is that same module with its adapters disabled. On-policy
distillation (``algorithm.distill.enable``, :mod:`verl.workers.teacher`): a frozen teacher
beside the reference scores the student's samples (:meth:`compute_teacher_log_prob`) and the
update adds ``coef x`` the reverse KL to it (:func:`verl.algorithms.distill_loss`). With the
teacher on a pool of its own (``teacher_pool=separate``, :mod:`verl.workers.teacher_worker`)
this worker loads no teacher and, for ``topk``, serves the student's top-k ids
(:meth:`compute_distill_topk_ids`) that the teacher's group scores.

The worker reads an :class:`~verl.workers.specs.ActorRolloutRefSpec` (built from the config
by :func:`verl.workers.specs.actor_rollout_ref_spec`) and keeps to translating calls; the
parts live beside it: :mod:`verl.workers.actor_setup` (loading the models),
:mod:`verl.workers.actor_rollout` (rollout engine, sampling, weight pushes),
:mod:`verl.workers.log_prob_passes` (scoring passes), :mod:`verl.workers.actor_update` (the
update) with the loss bound once at set-up (:mod:`verl.workers.losses`), and
:mod:`verl.workers.checkpointing` (checkpoints).

A rollout engine that keeps its own copy of the weights (vLLM, SGLang: ``owns_weights``)
takes them lazily: an update or a checkpoint load only marks that copy stale, and the next
``generate_sequences`` (a training rollout, validation, ReMax's greedy baseline) pushes the
weights first. With ``trainer.async_rollout=true`` training samples on the rollout copy, so
this engine then takes a push only before it is used, not after every update.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from verl.controller import Dispatch, Worker, register
from verl.engine import OptimSpec, build_engine
from verl.engine.options import EngineOptions
from verl.models import load_tokenizer
from verl.protocol import DataProto
from verl.utils.device import resolve_device
from verl.utils.rng import seed_all
from verl.workers.actor_rollout import (
    SAMPLING_OVERRIDES,
    agreed_seed,
    build_policy_rollout,
    generation_group,
    own_samples,
    push_actor_weights,
    rank_rollout,
    run_generation,
    sampling_params,
)
from verl.workers.actor_setup import (
    checkpoint_policy,
    load_policy,
    reference_dynamic_precision,
    reference_module,
    teacher_module,
)
from verl.workers.actor_update import SEQUENCE_KEYS, prepare_update, run_update
from verl.workers.checkpointing import load_worker_checkpoint, save_role_checkpoint
from verl.workers.common import (
    ensure_process_group,
    join_in_group,
    save_hf_model,
    sequence_group_batch,
)
from verl.workers.log_prob_passes import (
    PROMPT_KEYS,
    TEACHER_KEYS,
    response_log_probs,
    student_topk_ids,
    teacher_topk_scores,
)
from verl.workers.losses import bind_actor_loss
from verl.workers.multi_turn import build_agent_loop
from verl.workers.specs import ActorRolloutRefSpec, check_spec
from verl.workers.vision_inputs import IMAGE_KEYS

logger = logging.getLogger(__name__)

# The data contract (verl.controller.dispatch.register): what each method reads. What a
# multi-turn interaction reads of its prompt (verl.rollout.agent_loop.CONTEXT_KEYS):
_INTERACTION_KEYS = ("raw_prompt", "data_source", "ground_truth", "extra_info")


class ActorRolloutRefWorker(Worker):
    """Actor (trainable policy) + rollout (sampling) + optional reference policy.

    Args:
        spec: what the worker reads (:func:`verl.workers.specs.actor_rollout_ref_spec`);
            ``spec.role`` ``"actor_rollout_ref"`` also keeps a reference policy.
        module: an already-built causal LM to use instead of loading ``model.path``.
        tokenizer: a tokenizer to use instead of loading one.
    """

    def __init__(
        self,
        spec: ActorRolloutRefSpec,
        module: torch.nn.Module | None = None,
        tokenizer: Any = None,
        **worker_kwargs: Any,
    ) -> None:
        super().__init__(**worker_kwargs)
        check_spec(spec, ActorRolloutRefSpec, "actor_rollout_ref_spec")
        # Every process draws reproducible random numbers (a Ray actor starts from a random
        # torch seed); rank 0 in the driver process repeats the trainer's own seeding.
        seed_all(spec.seed + self.rank)
        self.spec = spec
        self.role = spec.role
        self.tokenizer = tokenizer or load_tokenizer(
            spec.model.tokenizer_path, trust_remote_code=spec.model.trust_remote_code
        )
        self.tokenizer.padding_side = "left"
        self._given_module = module
        self.device = resolve_device(spec.device, self.local_rank or 0)
        self.engine = None
        self.rollout = None
        self.agent_loop = None
        self.actor_loss = None  # the policy loss, bound from the spec at set-up
        self.ref_engine = None
        self.ref_dynamic = None  # DynamicPrecision of the reference (dynamic_precision=true)
        self.lora_reference = False  # LoRA: the reference is the actor, adapters disabled
        self.teacher_engine = None  # algorithm.distill: the frozen teacher
        self._update_calls = 0
        self._generate_calls = 0
        self._rollout_weights_stale = False  # an engine with its own copy needs a push
        # pushes made since the last update_actor reported them: (count, seconds)
        self._pushes_since_update = (0, 0.0)

    # ------------------------------------------------------------------ set-up
    def _engine(self, module: torch.nn.Module, optim: Any, options: EngineOptions) -> Any:
        """An engine of the actor's strategy on this worker's device (fsdp2: in its group)."""
        strategy = self.spec.actor.strategy
        if strategy == "fsdp2":
            ensure_process_group(self.rank, self.world_size, self.device.type)
        return build_engine(strategy, module, optim, options.replace(device=self.device))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_steps: int) -> None:
        """Load the policy, build its train engine, rollout engine and reference copy."""
        spec = self.spec
        rollout_cls, shared_engine = build_policy_rollout(spec.rollout, self.world_size)
        given = self._given_module is not None
        module = load_policy(spec, self._given_module, self.tokenizer, self.device)
        self._given_module = None
        lora = spec.model.lora is not None
        self.lora_reference = lora and spec.ref is not None
        if spec.ref is not None and not lora:
            self.ref_engine = self._engine(reference_module(spec, module), None, spec.ref.engine)
            self.ref_dynamic = reference_dynamic_precision(
                spec, self.ref_engine.module, self.device, given
            )
        if spec.teacher is not None and not spec.teacher.separate:
            teacher = teacher_module(spec, self.tokenizer, self.device)
            self.teacher_engine = self._engine(teacher, None, spec.teacher.engine)
        checkpoint_policy(spec, module)
        optim = OptimSpec.from_config(spec.actor.optim, total_steps=total_steps)
        self.engine = self._engine(module, optim, spec.actor.engine)
        self.actor_loss = bind_actor_loss(spec.actor.loss)
        self.rollout = rank_rollout(
            rollout_cls,
            spec.rollout,
            self.engine.module,
            self.tokenizer,
            self.rank,
            self.world_size,
        )
        self._rollout_weights_stale = shared_engine  # every rank joins the first push
        self.rollout.sleep()
        # multi_turn.enable: generate through the agent loop (tools) over the same engine
        self.agent_loop = build_agent_loop(
            spec.rollout, spec.max_prompt_length, self.rollout, self.tokenizer
        )

    def _sync_rollout_weights(self) -> dict[str, float]:
        """Push the actor's weights into a rollout engine that keeps its own copy (vLLM);
        see :func:`verl.workers.actor_rollout.push_actor_weights`."""
        if not self.rollout.owns_weights:
            return {}
        stats = push_actor_weights(self.engine, self.rollout)
        self._rollout_weights_stale = False
        return stats

    def _push_stale_weights(self) -> None:
        """The lazy push before a generation: :meth:`_sync_rollout_weights`, counted for the
        next :meth:`update_actor`'s metrics."""
        seconds = self._sync_rollout_weights().get("rollout/weight_sync_seconds", 0.0)
        count, total = self._pushes_since_update
        self._pushes_since_update = (count + 1, total + seconds)

    # ------------------------------------------------------------------ rollout
    @register(
        dispatch_mode=Dispatch.DP_COMPUTE,
        reads=PROMPT_KEYS,
        optional=(*_INTERACTION_KEYS, *IMAGE_KEYS),
        meta=(*SAMPLING_OVERRIDES, "seed"),
    )
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sample ``n`` responses per prompt (``meta_info`` may override sampling keys).

        Through a worker group only the prompt tensors cross, so the output holds the
        rollout's keys; the driver joins the prompts' per-sample fields back on.
        """
        if not any(k in prompts.meta_info for k in SAMPLING_OVERRIDES):
            # Only training rollouts advance the seed: validation frequency must not
            # change which samples training sees.
            self._generate_calls += 1
        # tensor parallelism: the tensor group samples its joined prompts together, seeded
        # as its data-parallel rank
        group = generation_group(self.engine, self.rollout)
        if group is not None:
            prompts, own = join_in_group(prompts, group)
        params = sampling_params(
            self.spec.rollout,
            prompts.meta_info,
            eos_token_id=self.tokenizer.eos_token_id,
            max_new_tokens=self.spec.max_response_length,
            generate_calls=self._generate_calls,
            rank=self.rank if group is None else group.dp_rank,
        )
        run = self.agent_loop.run if self.agent_loop is not None else self.rollout.generate
        stale = self._push_stale_weights if self._rollout_weights_stale else None
        if group is None:
            return run_generation(
                self.engine, self.rollout, run, prompts, params, self.device, stale
            )
        params = agreed_seed(params, group)
        out = run_generation(self.engine, self.rollout, run, prompts, params, self.device, stale)
        return own_samples(out, own, params.n)

    # ------------------------------------------------------------------ log-probs
    def _log_probs(
        self, engine: Any, data: DataProto, mbs: int | None, entropy: bool, sps: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """:func:`~verl.workers.log_prob_passes.response_log_probs` of ``engine``'s module."""
        return response_log_probs(
            self.engine, engine.module, data, mbs, self.spec.actor, self.device, entropy, sps
        )

    @register(
        dispatch_mode=Dispatch.DP_COMPUTE,
        reads=SEQUENCE_KEYS,
        optional=IMAGE_KEYS,
        meta=("temperature",),
    )
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """Log-probs of the sampled tokens under the current (old) policy, and entropy.

        Returns ``old_log_probs`` and ``entropys``, both ``(batch, response_len)``, and
        ``sum_pi_squared`` (``sum_v pi(v)^2`` per token) when the advantage estimator's
        registry entry declares ``needs_sum_pi_squared``.
        """
        rollout = self.spec.rollout
        data, rows = sequence_group_batch(self.engine, data)
        with self.engine.eval_mode():
            log_probs, entropy, sps = self._log_probs(
                self.engine,
                data,
                rollout.log_prob_micro_batch_size,
                True,
                rollout.with_sum_pi_squared,
            )
        tensors = {"old_log_probs": log_probs[rows], "entropys": entropy[rows]}
        if sps is not None:
            tensors["sum_pi_squared"] = sps[rows]
        return DataProto.from_dict(
            tensors=tensors,
            meta_info={"temperature": data.meta_info.get("temperature", 1.0)},
        )

    @register(
        dispatch_mode=Dispatch.DP_COMPUTE,
        reads=SEQUENCE_KEYS,
        optional=IMAGE_KEYS,
        meta=("temperature",),
    )
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """Log-probs of the sampled tokens under the frozen reference policy."""
        mbs = self.spec.ref.log_prob_micro_batch_size if self.spec.ref is not None else None
        if self.lora_reference:  # the base model: the actor with its adapters disabled
            data, rows = sequence_group_batch(self.engine, data)
            with self.engine.eval_mode(), self.engine.module.disable_adapter():
                log_probs, _, _ = self._log_probs(self.engine, data, mbs, False)
            return DataProto.from_dict(tensors={"ref_log_probs": log_probs[rows]})
        if self.ref_engine is None:
            raise RuntimeError(
                "compute_ref_log_prob called on a worker built without a reference policy "
                "(role='actor_rollout'); enable actor.use_kl_loss or algorithm.use_kl_in_reward"
            )
        if self.ref_dynamic is not None:
            self.ref_dynamic.before_phase()
        data, rows = sequence_group_batch(self.ref_engine, data)
        with self.ref_engine.eval_mode():
            log_probs, _, _ = self._log_probs(self.ref_engine, data, mbs, False)
        return DataProto.from_dict(tensors={"ref_log_probs": log_probs[rows]})

    @register(
        dispatch_mode=Dispatch.DP_COMPUTE,
        reads=SEQUENCE_KEYS,
        optional=IMAGE_KEYS,
        meta=("temperature",),
    )
    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """The distillation teacher's scores of the student's samples (``algorithm.distill``).

        Returns ``teacher_log_probs`` ``(batch, response_len)``: the teacher's log-probs of
        the sampled tokens at the sampling temperature; with a top-k estimator also
        ``distill_topk_ids`` (the student's ``k`` most likely tokens at each position under
        the weights that sampled the batch) and ``teacher_topk_log_probs`` at those ids, both
        ``(batch, response_len, k)`` (:func:`verl.workers.log_prob_passes.teacher_topk_scores`).
        """
        if self.teacher_engine is None:
            raise RuntimeError(
                "compute_teacher_log_prob called on a worker built without a teacher; set "
                "algorithm.distill.enable=true and algorithm.distill.teacher_path (with "
                "algorithm.distill.teacher_pool=separate the teacher's own group scores)"
            )
        teacher = self.spec.teacher
        mbs = teacher.log_prob_micro_batch_size
        data, rows = sequence_group_batch(self.teacher_engine, data)
        if not teacher.needs_topk:
            with self.teacher_engine.eval_mode():
                log_probs, _, _ = self._log_probs(self.teacher_engine, data, mbs, False)
            return DataProto.from_dict(tensors={"teacher_log_probs": log_probs[rows]})
        scores = teacher_topk_scores(
            self.engine, self.teacher_engine, data, mbs, teacher.topk, self.spec.actor, self.device
        )
        return DataProto.from_dict(tensors={key: scores[key][rows] for key in TEACHER_KEYS})

    @register(
        dispatch_mode=Dispatch.DP_COMPUTE,
        reads=SEQUENCE_KEYS,
        meta=("temperature", "distill_vocab"),
    )
    def compute_distill_topk_ids(self, data: DataProto) -> DataProto:
        """The student's half of a split top-k teacher pass (``teacher_pool=separate``):
        ``distill_topk_ids`` ``(batch, response_len, k)``, its ``k`` most likely ids at each
        position under the weights that sampled the batch, among the first
        ``meta_info["distill_vocab"]`` (the teacher's head size). They travel in the batch
        to the teacher's group, which returns its log-probs at them."""
        teacher = self.spec.teacher
        if teacher is None or not teacher.needs_topk:
            raise RuntimeError(
                "compute_distill_topk_ids needs algorithm.distill.enable=true with "
                "algorithm.distill.estimator=topk"
            )
        data, rows = sequence_group_batch(self.engine, data)
        ids = student_topk_ids(
            self.engine,
            data,
            teacher.log_prob_micro_batch_size,
            teacher.topk,
            data.meta_info.get("distill_vocab"),
            self.spec.actor,
            self.device,
        )
        return DataProto.from_dict(tensors={"distill_topk_ids": ids[rows]})

    # ------------------------------------------------------------------ update
    @register(
        dispatch_mode=Dispatch.DP_COMPUTE,
        reads=(*SEQUENCE_KEYS, "advantages"),
        optional=(
            "old_log_probs",
            "ref_log_probs",
            "rollout_log_probs",
            *TEACHER_KEYS,
            *IMAGE_KEYS,
        ),
        meta=("temperature",),
    )
    def update_actor(self, data: DataProto) -> dict[str, float]:
        """PPO epochs over mini-batches (one optimizer step each) and micro-batches.

        The loss is the binding of :func:`verl.workers.losses.bind_actor_loss` (made at
        set-up); the loop is :mod:`verl.workers.actor_update` over the engine's
        ``forward_backward``. Micro-batch losses are weighted so that the accumulated
        gradient equals the gradient of the loss aggregated over the whole mini-batch
        (exactly, for every ``loss_agg_mode``). Returns the metrics, reduced over the
        data-parallel ranks.

        Without ``old_log_probs`` (the trainer skipped the old-log-prob pass, see
        ``verl.trainer.rl.passes``) the update must be one optimizer step; the old log-probs
        are then its own detached log-probs, and the metrics the pass would have fed
        (``actor/entropy``, ``rollout/*`` drift) come from its forward.

        With a rollout engine that keeps its own weights the update only marks them stale
        (module docstring); ``rollout/weight_pushes`` and ``rollout/weight_sync_seconds``
        are then the pushes made (and their seconds) since the previous update: in
        synchronous training this step's generation pushed the previous update's weights.
        """
        batch = prepare_update(
            self.engine,
            data,
            self.spec.actor,
            self.world_size,
            self._update_calls == 0,
            takes_rollout_log_prob=self.actor_loss.takes_rollout_log_prob,
        )
        self._update_calls += 1
        metrics = run_update(
            self.engine,
            batch,
            self.actor_loss,
            self.spec.actor,
            seed=self.spec.seed + self._update_calls,
            device=self.device,
        )
        # An engine with its own copy takes the new weights before its next generation.
        self._rollout_weights_stale = True
        if self.rollout.owns_weights:
            count, seconds = self._pushes_since_update
            self._pushes_since_update = (0, 0.0)
            metrics["rollout/weight_pushes"] = float(count)
            metrics["rollout/weight_sync_seconds"] = seconds
        return metrics

    def close(self) -> None:
        """Release the rollout engine (an inference engine's processes, memory and model
        directory); the worker group's shutdown calls it."""
        if self.agent_loop is not None and hasattr(self.agent_loop, "close"):
            self.agent_loop.close()  # rollout.agent: its OpenAI endpoint's server thread
        if self.rollout is not None:
            self.rollout.close()

    # ------------------------------------------------------------------ export
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_hf(self, out_dir: str) -> str:
        """Write the actor as a HuggingFace model directory (weights, config, tokenizer).

        A collective under FSDP2 (the full state dict is gathered); rank 0 writes.
        """
        sharded = self.spec.actor.strategy == "fsdp2"
        state = self.engine.state_dict_for_save() if sharded else None
        if self.rank == 0:
            save_hf_model(self.engine.module, self.tokenizer, out_dir, state_dict=state)
        return str(out_dir)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def state_dict_for_save(self) -> dict[str, torch.Tensor]:
        return self.engine.state_dict_for_save()

    # ------------------------------------------------------------------ checkpoints
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(
        self, path: str, hf_config_dir: str | None = None, hf_weights: bool = False
    ) -> None:
        """Write this rank's share of a run checkpoint (a collective under FSDP2).

        The actor engine (weights, optimizer, LR schedule), this rank's RNG and call
        counters go under ``path``; rank 0 writes the HF config and tokenizer to
        ``hf_config_dir`` for export, or with ``hf_weights`` (``save_contents`` has
        ``hf_model``) the whole model as :meth:`save_hf` writes it. The reference policy is
        not saved: it is the initial model, loaded again from ``model.path`` on resume.
        """
        save_role_checkpoint(
            self.engine,
            self.tokenizer,
            path,
            rank=self.rank,
            world_size=self.world_size,
            counters={"update_calls": self._update_calls, "generate_calls": self._generate_calls},
            hf_config_dir=hf_config_dir,
            write_hf_model=self._write_hf_model if hf_weights else None,
        )

    def _write_hf_model(self, hf_config_dir: str | None) -> None:
        if hf_config_dir is None:
            raise ValueError("hf_weights=True needs hf_config_dir")
        self.save_hf(hf_config_dir)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote (a collective under FSDP2)."""
        counters = load_worker_checkpoint(
            self.engine, path, rank=self.rank, world_size=self.world_size
        )
        self._update_calls = counters["update_calls"]
        self._generate_calls = counters["generate_calls"]
        self._rollout_weights_stale = True

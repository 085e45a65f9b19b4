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
a share of every sequence's tokens; generation stays per rank. The update's loss is the
pure function ``verl.algorithms.actor_loss``, run by the engine's ``forward_backward``.

LoRA (``model.lora_rank > 0``, :mod:`verl.models.lora`): the actor is a ``PeftModel`` whose
adapters alone train; the reference is that same module with its adapters disabled, so no
reference copy is built.

On-policy distillation (``algorithm.distill.enable``, :mod:`verl.workers.teacher`): a frozen
teacher loaded from ``algorithm.distill.teacher_path`` lives beside the reference in an
inference-only engine; :meth:`ActorRolloutRefWorker.compute_teacher_log_prob` scores the
student's samples and the update adds ``coef x`` the reverse KL to it
(:func:`verl.algorithms.distill_loss`).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import torch

from verl.algorithms import ADVANTAGE_ESTIMATORS, DISTILL_ESTIMATORS, POLICY_LOSSES
from verl.algorithms.distill import distill_loss
from verl.algorithms.losses import actor_loss
from verl.config import TrainerConfig
from verl.controller import Dispatch, Worker, register
from verl.engine import OptimSpec, build_engine
from verl.kernels.torch_functional import compute_response_log_probs
from verl.kernels.ulysses import sequence_parallel_of
from verl.models import (
    attention_implementation,
    check_vocab_covers_tokenizer,
    checkpoint_if_configured,
    load_causal_lm,
    load_tokenizer,
    resolve_dtype,
)
from verl.models.lora import (
    apply_lora,
    is_lora_model,
    lora_config_of,
    lora_scaling,
    lora_spec_from_config,
    merged_state_dict,
)
from verl.protocol import DataProto
from verl.rollout import SamplingParams, get_rollout_engine
from verl.rollout.rank_zero import build_rank_rollout
from verl.utils.device import resolve_device
from verl.utils.memory import release_memory
from verl.utils.rng import seed_all
from verl.workers.checkpointing import (
    load_worker_checkpoint,
    save_hf_metadata,
    save_worker_checkpoint,
)
from verl.workers.common import (
    apply_inference_precision,
    dynamic_precision,
    engine_options,
    micro_batches,
    own_old_log_prob_metrics,
    precision_options,
    rollout_options,
    run_ppo_update,
    save_hf_model,
    sequence_group_batch,
    to_device,
)
from verl.workers.micro_batching import MicroBatch, gather_response_outputs
from verl.workers.multi_turn import build_agent_loop
from verl.workers.teacher import check_same_tokenizer, response_log_softmax

logger = logging.getLogger(__name__)

_SAMPLING_OVERRIDES = ("n", "temperature", "top_p", "top_k", "do_sample")

# The data contract (verl.controller.dispatch.register): what each method reads.
_PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")
_SEQUENCE_KEYS = (*_PROMPT_KEYS, "response_mask")
# What a multi-turn interaction reads of its prompt (verl.rollout.agent_loop.CONTEXT_KEYS).
_INTERACTION_KEYS = ("raw_prompt", "data_source", "ground_truth", "extra_info")
# What the teacher pass returns and the update reads (algorithm.distill).
_TEACHER_KEYS = ("teacher_log_probs", "teacher_topk_log_probs", "distill_topk_ids")


class ActorRolloutRefWorker(Worker):
    """Actor (trainable policy) + rollout (sampling) + optional reference policy.

    Args:
        config: the full trainer config (the worker reads ``actor_rollout_ref``, ``data``).
        role: ``"actor_rollout"`` or ``"actor_rollout_ref"`` (also keeps a reference copy).
        module: an already-built causal LM to use instead of loading ``model.path``.
        tokenizer: a tokenizer to use instead of loading one.
    """

    def __init__(
        self,
        config: TrainerConfig,
        role: str = "actor_rollout_ref",
        module: torch.nn.Module | None = None,
        tokenizer: Any = None,
        **worker_kwargs: Any,
    ) -> None:
        super().__init__(**worker_kwargs)
        if role not in ("actor_rollout", "actor_rollout_ref"):
            raise ValueError(f"role={role!r}; expected 'actor_rollout' or 'actor_rollout_ref'")
        # Every process draws reproducible random numbers (a Ray actor starts from a random
        # torch seed); rank 0 in the driver process repeats the trainer's own seeding.
        seed_all(config.trainer.seed + self.rank)
        self.config = config
        self.role = role
        mcfg = config.actor_rollout_ref.model
        self.tokenizer = tokenizer or load_tokenizer(
            mcfg.tokenizer_path or mcfg.path, trust_remote_code=mcfg.trust_remote_code
        )
        self.tokenizer.padding_side = "left"
        self._given_module = module
        self.device = resolve_device(config.trainer.device, self.local_rank or 0)
        self.engine = None
        self.rollout = None
        self.agent_loop = None
        self.ref_engine = None
        self.ref_dynamic = None  # DynamicPrecision of the reference (dynamic_precision=true)
        self.lora_reference = False  # LoRA: the reference is the actor, adapters disabled
        self.teacher_engine = None  # algorithm.distill: the frozen teacher
        self._update_calls = 0
        self._generate_calls = 0
        self._rollout_weights_stale = False  # an engine with its own copy needs a push

    # ------------------------------------------------------------------ set-up
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_steps: int) -> None:
        """Load the policy, build its train engine, rollout engine and reference copy."""
        arr = self.config.actor_rollout_ref
        strategy = self.config.engine_strategy("actor_rollout_ref")
        rollout_cls = get_rollout_engine(arr.rollout.name)
        rollout_cls.check_available()  # package / device, before any model loads
        shared_engine = rollout_cls.owns_weights and self.world_size > 1
        if shared_engine and (arr.rollout.multi_turn.enable or arr.rollout.agent.enable):
            raise NotImplementedError(
                f"rollout.name={arr.rollout.name} on {self.world_size} ranks serves all ranks "
                "from one engine in lock step, which multi_turn.enable=true cannot use; use "
                "one actor rank or rollout.name=native"
            )
        module = self._given_module
        given = module is not None
        load_kwargs = dict(
            path=arr.model.path,
            dtype=resolve_dtype(arr.model.dtype),
            trust_remote_code=arr.model.trust_remote_code,
            override_config=arr.model.override_config,
            attn_implementation=attention_implementation(
                self.config.trainer.use_flash_attention, self.device
            ),
        )
        if module is None:
            module = load_causal_lm(**load_kwargs)
        self._given_module = None
        check_vocab_covers_tokenizer(module, self.tokenizer, "actor_rollout_ref.model")
        lora = lora_spec_from_config(arr.model)
        if lora is not None:
            # adapters drawn from trainer.seed alone: every rank starts from one process's
            module = apply_lora(module, lora, seed=self.config.trainer.seed)
        self.lora_reference = lora is not None and self.role == "actor_rollout_ref"
        if self.role == "actor_rollout_ref" and lora is None:
            # The reference is the initial policy, frozen; copied before any update.
            ref_module = copy.deepcopy(module).eval().requires_grad_(False)
            ref_module = apply_inference_precision(self.config, "reference", ref_module)
            ref_sp = arr.ref.ulysses_sequence_parallel_size
            if ref_sp is None:
                ref_sp = arr.actor.ulysses_sequence_parallel_size
            self.ref_engine = build_engine(
                strategy,
                module=ref_module,
                optim=None,
                device=self.device,
                **precision_options(
                    self.config,
                    "reference",
                    strategy,
                    engine_options(self, strategy, arr.ref.fsdp_config, ref_sp),
                ),
            )
            self.ref_dynamic = dynamic_precision(
                self.config,
                "reference",
                self.ref_engine.module,
                self.device,
                reload=None if given else lambda: load_causal_lm(**load_kwargs).state_dict(),
            )
        if self.config.algorithm.distill.enable:
            self.teacher_engine = self._build_teacher(strategy)
        data, actor = self.config.data, arr.actor
        shared = actor.pack_sequences and actor.share_prompt_prefix
        checkpoint_if_configured(
            module,
            arr.model.enable_gradient_checkpointing,
            actor.max_update_tokens(
                data.max_prompt_length, data.max_response_length, arr.rollout.n if shared else 1
            ),
            "actor_rollout_ref.model.enable_gradient_checkpointing",
        )
        self.engine = build_engine(
            strategy,
            module=module,
            optim=OptimSpec.from_config(arr.actor.optim, total_steps=total_steps),
            grad_clip=arr.actor.grad_clip,
            device=self.device,
            **precision_options(
                self.config,
                "actor",
                strategy,
                engine_options(
                    self,
                    strategy,
                    arr.actor.fsdp_config,
                    arr.actor.ulysses_sequence_parallel_size,
                ),
            ),
        )
        self.rollout = build_rank_rollout(
            rollout_cls,
            self.engine.module,
            self.tokenizer,
            rollout_options(self.config, rollout_cls),
            rank=self.rank,
            world_size=self.world_size,
        )
        self._rollout_weights_stale = shared_engine  # every rank joins the first push
        self.rollout.sleep()
        # multi_turn.enable: generate through the agent loop (tools) over the same engine
        self.agent_loop = build_agent_loop(self.config, self.rollout, self.tokenizer)

    def _build_teacher(self, strategy: str) -> Any:
        """The distillation teacher: ``algorithm.distill.teacher_path`` loaded frozen
        (``requires_grad=False``, eval mode) into an engine without an optimizer, after
        checking that its tokenizer is the student's."""
        dcfg, arr = self.config.algorithm.distill, self.config.actor_rollout_ref
        student_path = arr.model.tokenizer_path or arr.model.path
        teacher_tokenizer = load_tokenizer(
            dcfg.teacher_path, trust_remote_code=arr.model.trust_remote_code
        )
        check_same_tokenizer(self.tokenizer, teacher_tokenizer, student_path, dcfg.teacher_path)
        precision = dcfg.teacher_precision
        dtype = precision if precision in ("fp32", "bf16", "fp16") else None
        module = load_causal_lm(
            path=dcfg.teacher_path,
            dtype=resolve_dtype(dtype or arr.model.dtype),
            trust_remote_code=arr.model.trust_remote_code,
            attn_implementation=attention_implementation(
                self.config.trainer.use_flash_attention, self.device
            ),
        )
        check_vocab_covers_tokenizer(module, self.tokenizer, "algorithm.distill.teacher_path")
        module = module.eval().requires_grad_(False)
        if precision == "fp8":
            from verl.models.fp8 import quantize_model_fp8_

            quantize_model_fp8_(module)
        elif precision == "int4":
            from verl.models.int4 import quantize_model_int4_

            quantize_model_int4_(module)
        options = engine_options(self, strategy, arr.ref.fsdp_config, 1)
        if dtype is not None:
            options["param_dtype"] = dtype
        logger.info("distillation teacher %s (%s)", dcfg.teacher_path, precision)
        return build_engine(strategy, module=module, optim=None, device=self.device, **options)

    def _sync_rollout_weights(self) -> dict[str, float]:
        """Push the actor's weights into a rollout engine that keeps its own copy (vLLM).

        The module's own state dict: HF names, ``lm_head.weight`` included when tied;
        FSDP2 DTensors are gathered bucket by bucket by the push (on several ranks every
        rank joins the gather and rank 0 pushes: ``verl.rollout.rank_zero``).
        """
        if not self.rollout.owns_weights:
            return {}
        module = self.engine.module
        state = module.state_dict()
        if is_lora_model(module):  # the engine takes plain weights: adapters folded in
            state = merged_state_dict(state, lora_scaling(module))
        stats = self.rollout.update_weights(state.items())
        self._rollout_weights_stale = False
        return {"rollout/weight_sync_seconds": stats["seconds"]}

    # ------------------------------------------------------------------ rollout
    def _sampling_params(self, meta_info: dict[str, Any]) -> SamplingParams:
        rcfg = self.config.actor_rollout_ref.rollout
        values = {key: getattr(rcfg, key) for key in _SAMPLING_OVERRIDES}
        values |= {k: meta_info[k] for k in _SAMPLING_OVERRIDES if k in meta_info}
        eos = self.tokenizer.eos_token_id
        seed = meta_info.get("seed")
        if seed is None and rcfg.seed is not None:
            # A fixed rollout.seed seeds each call (and each data-parallel rank)
            # differently, reproducibly.
            seed = rcfg.seed + self._generate_calls + 100_003 * self.rank
        return SamplingParams(
            n=values["n"],
            temperature=values["temperature"],
            top_p=values["top_p"],
            top_k=values["top_k"],
            do_sample=values["do_sample"],
            max_new_tokens=self.config.data.max_response_length,
            stop_token_ids=[eos] if eos is not None else [],
            stop_strings=list(rcfg.stop),
            seed=seed,
        )

    @register(
        dispatch_mode=Dispatch.DP_COMPUTE,
        reads=_PROMPT_KEYS,
        optional=_INTERACTION_KEYS,
        meta=(*_SAMPLING_OVERRIDES, "seed"),
    )
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sample ``n`` responses per prompt (``meta_info`` may override sampling keys).

        Through a worker group only the prompt tensors cross, so the output holds the
        rollout's keys; the driver joins the prompts' per-sample fields back on.
        """
        if not any(k in prompts.meta_info for k in _SAMPLING_OVERRIDES):
            # Only training rollouts advance the seed: validation frequency must not
            # change which samples training sees.
            self._generate_calls += 1
        params = self._sampling_params(prompts.meta_info)
        generate = self.agent_loop.run if self.agent_loop is not None else self.rollout.generate
        if self.rollout.owns_weights:
            # Its own copy of the weights: no gather; pushed after each update (and here
            # after a checkpoint load).
            self.rollout.wake_up()
            if self._rollout_weights_stale:
                self._sync_rollout_weights()
            out = generate(to_device(prompts, self.device), params).to("cpu")
            self.rollout.sleep()
        else:
            # Sampling computes in the training precision (mixed_precision=bf16 -> bf16
            # autocast), as the log-prob passes that score these samples do.
            with self.engine.gathered_params(), self.engine.autocast():
                out = generate(to_device(prompts, self.device), params).to("cpu")
        # The trainer's log-prob recomputation must use the temperature that sampled.
        out.meta_info["temperature"] = params.logprob_temperature
        release_memory()  # the KV cache and decode buffers, before the next phase
        return out

    # ------------------------------------------------------------------ log-probs
    def _log_probs(
        self,
        module: torch.nn.Module,
        data: DataProto,
        micro_batch_size: int | None,
        with_entropy: bool,
        with_sum_pi_squared: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        temperature = data.meta_info.get("temperature", 1.0)
        response_len = data.batch["response_mask"].shape[1]
        acfg = self.config.actor_rollout_ref.actor
        log_probs, entropies, sum_pi_squared = [], [], []
        inputs = to_device(
            data.select(batch_keys=["input_ids", "attention_mask", "position_ids"]), self.device
        )
        with torch.no_grad(), self.engine.autocast():
            sp = sequence_parallel_of(module)
            sp_size = 1 if sp is None else sp.size
            for mb in micro_batches(inputs, response_len, micro_batch_size, acfg, sp_size):
                x = mb.data.batch
                lp, ent, *sps = compute_response_log_probs(
                    module,
                    x["input_ids"],
                    x["attention_mask"],
                    x["position_ids"],
                    response_len=mb.response_len,
                    temperature=temperature,
                    chunk_size=acfg.logprob_chunk_size,
                    calculate_entropy=with_entropy,
                    calculate_sum_pi_squared=with_sum_pi_squared,
                    pack=acfg.pack_sequences,
                    share_prefix=acfg.share_prompt_prefix,
                )
                log_probs.append((mb, lp.float().cpu()))
                if ent is not None:
                    entropies.append((mb, ent.float().cpu()))
                if sps:
                    sum_pi_squared.append((mb, sps[0].float().cpu()))
        rows = len(data)
        release_memory()  # the forwards' activations, before the next phase
        return (
            gather_response_outputs(log_probs, rows, response_len),
            gather_response_outputs(entropies, rows, response_len) if entropies else None,
            gather_response_outputs(sum_pi_squared, rows, response_len) if sum_pi_squared else None,
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE, reads=_SEQUENCE_KEYS, meta=("temperature",))
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """Log-probs of the sampled tokens under the current (old) policy, and entropy.

        Returns ``old_log_probs`` and ``entropys``, both ``(batch, response_len)``, and
        ``sum_pi_squared`` (``sum_v pi(v)^2`` per token) when the advantage estimator's
        registry entry declares ``needs_sum_pi_squared``.
        """
        rcfg = self.config.actor_rollout_ref.rollout
        mbs = rcfg.log_prob_micro_batch_size_per_device  # None: as the update
        with_sps = bool(
            ADVANTAGE_ESTIMATORS.needs(self.config.algorithm.adv_estimator, "needs_sum_pi_squared")
        )
        data, rows = sequence_group_batch(self.engine, data)
        with self.engine.eval_mode():
            log_probs, entropy, sps = self._log_probs(
                self.engine.module, data, mbs, True, with_sum_pi_squared=with_sps
            )
        tensors = {"old_log_probs": log_probs[rows], "entropys": entropy[rows]}
        if sps is not None:
            tensors["sum_pi_squared"] = sps[rows]
        return DataProto.from_dict(
            tensors=tensors,
            meta_info={"temperature": data.meta_info.get("temperature", 1.0)},
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE, reads=_SEQUENCE_KEYS, meta=("temperature",))
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """Log-probs of the sampled tokens under the frozen reference policy."""
        mbs = self.config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_device
        if self.lora_reference:  # the base model: the actor with its adapters disabled
            data, rows = sequence_group_batch(self.engine, data)
            with self.engine.eval_mode(), self.engine.module.disable_adapter():
                log_probs, _, _ = self._log_probs(self.engine.module, data, mbs, False)
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
            log_probs, _, _ = self._log_probs(self.ref_engine.module, data, mbs, False)
        return DataProto.from_dict(tensors={"ref_log_probs": log_probs[rows]})

    @register(dispatch_mode=Dispatch.DP_COMPUTE, reads=_SEQUENCE_KEYS, meta=("temperature",))
    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """The distillation teacher's scores of the student's samples (``algorithm.distill``).

        Returns ``teacher_log_probs`` ``(batch, response_len)``: the teacher's log-probs of
        the sampled tokens at the sampling temperature. With a top-k estimator
        (``estimator=topk``) also ``distill_topk_ids`` ``(batch, response_len, k)``: the
        student's ``k`` most likely tokens at each position under the current weights (the
        ones that sampled the batch, where the update starts), and
        ``teacher_topk_log_probs`` ``(batch, response_len, k)``: the teacher's full-vocabulary
        log-probs at those ids. The update recomputes the student's log-probs at the same
        ids with gradients; with one optimizer step per batch they are the student's top-k
        at the update. Full-vocabulary logits are held one micro-batch at a time.
        """
        if self.teacher_engine is None:
            raise RuntimeError(
                "compute_teacher_log_prob called on a worker built without a teacher; set "
                "algorithm.distill.enable=true and algorithm.distill.teacher_path"
            )
        dcfg = self.config.algorithm.distill
        mbs = (
            dcfg.log_prob_micro_batch_size_per_device
            or self.config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_device
        )
        data, rows = sequence_group_batch(self.teacher_engine, data)
        if not DISTILL_ESTIMATORS.needs(dcfg.estimator, "needs_topk"):
            with self.teacher_engine.eval_mode():
                log_probs, _, _ = self._log_probs(self.teacher_engine.module, data, mbs, False)
            return DataProto.from_dict(tensors={"teacher_log_probs": log_probs[rows]})
        temperature = data.meta_info.get("temperature", 1.0)
        response_len = data.batch["response_mask"].shape[1]
        inputs = to_device(data.select(batch_keys=list(_PROMPT_KEYS)), self.device)
        parts: dict[str, list] = {key: [] for key in _TEACHER_KEYS}
        acfg = self.config.actor_rollout_ref.actor
        with (
            torch.no_grad(),
            self.engine.eval_mode(),
            self.teacher_engine.eval_mode(),
            self.engine.autocast(),
        ):
            for mb in micro_batches(inputs, response_len, mbs, acfg, 1):
                x = mb.data.batch
                args = (x["input_ids"], x["attention_mask"], x["position_ids"], mb.response_len)
                student = response_log_softmax(self.engine.module, *args, temperature)
                teacher = response_log_softmax(self.teacher_engine.module, *args, temperature)
                vocab = min(student.shape[-1], teacher.shape[-1])  # heads may be padded apart
                k = min(dcfg.topk, vocab)
                ids = student[..., :vocab].topk(k, dim=-1).indices
                del student
                labels = x["input_ids"][:, -mb.response_len :, None]
                parts["teacher_log_probs"].append((mb, teacher.gather(-1, labels)[..., 0].cpu()))
                parts["teacher_topk_log_probs"].append((mb, teacher.gather(-1, ids).cpu()))
                parts["distill_topk_ids"].append((mb, ids.cpu()))
                del teacher
        release_memory()
        n = len(data)
        tensors = {
            key: gather_response_outputs(values, n, response_len)[rows]
            for key, values in parts.items()
        }
        return DataProto.from_dict(tensors=tensors)

    # ------------------------------------------------------------------ update
    @register(
        dispatch_mode=Dispatch.DP_COMPUTE,
        reads=(*_SEQUENCE_KEYS, "advantages"),
        optional=("old_log_probs", "ref_log_probs", "rollout_log_probs", *_TEACHER_KEYS),
        meta=("temperature",),
    )
    def update_actor(self, data: DataProto) -> dict[str, float]:
        """PPO epochs over mini-batches (one optimizer step each) and micro-batches.

        The loss is :func:`verl.algorithms.actor_loss`; the loop is
        :func:`verl.workers.common.run_ppo_update` over the engine's ``forward_backward``.
        Micro-batch losses are weighted so that the accumulated gradient equals the
        gradient of the loss aggregated over the whole mini-batch (exactly, for every
        ``loss_agg_mode``). Returns the metrics, reduced over the data-parallel ranks.

        Without ``old_log_probs`` (the trainer skipped the old-log-prob pass, see
        ``verl.trainer.rl.passes``) the update must be one optimizer step; the old log-probs
        are then its own detached log-probs, and the metrics the pass would have fed
        (``actor/entropy``, ``rollout/*`` drift) come from its forward.
        """
        acfg = self.config.actor_rollout_ref.actor
        # the rows of this rank's sequence group (its own rows without sequence parallelism)
        data, _ = sequence_group_batch(self.engine, data)
        # ppo_mini_batch_size counts prompts over all data-parallel ranks (sequence groups)
        mini_batch_size = (
            acfg.ppo_mini_batch_size
            * self.config.actor_rollout_ref.rollout.n
            // self._data_parallel_size()
        )
        keys = [*_SEQUENCE_KEYS, "advantages"]
        own_old = "old_log_probs" not in data.batch
        if own_old:
            if acfg.ppo_epochs != 1 or len(data) > mini_batch_size:
                raise ValueError(
                    f"update_actor: the batch has no old_log_probs, which is only right for "
                    f"one optimizer step per batch, but ppo_epochs={acfg.ppo_epochs} and "
                    f"{len(data)} rows > a mini-batch of {mini_batch_size}; run "
                    "compute_log_prob first (actor_rollout_ref.actor.recompute_old_log_prob)"
                )
        else:
            keys.append("old_log_probs")
        if acfg.use_kl_loss:
            keys.append("ref_log_probs")  # select() names it if the batch lacks it
        dcfg = self.config.algorithm.distill
        if dcfg.enable:  # select() names a missing one: the teacher pass did not run
            keys.append("teacher_log_probs")
            if DISTILL_ESTIMATORS.needs(dcfg.estimator, "needs_topk"):
                keys += ["teacher_topk_log_probs", "distill_topk_ids"]
        if acfg.rollout_is_threshold is not None or acfg.rollout_rs_threshold is not None:
            if "rollout_log_probs" in data.batch:
                keys.append("rollout_log_probs")
            elif self._update_calls == 0:
                logger.warning(
                    "actor.rollout_is_threshold=%s, rollout_rs_threshold=%s but the batch has "
                    "no rollout_log_probs (the rollout backend did not return them): no "
                    "rollout correction",
                    acfg.rollout_is_threshold,
                    acfg.rollout_rs_threshold,
                )
        self._update_calls += 1
        update_data = data.select(batch_keys=keys)
        recorded = None
        if own_old:  # the update's detached log-probs and entropies, by batch row
            update_data.batch["row_index"] = torch.arange(len(data))
            recorded = []
        acc = run_ppo_update(
            self.engine,
            update_data,
            self._actor_loss_fn(data.meta_info.get("temperature", 1.0), recorded),
            role_cfg=acfg,
            loss_agg_mode=acfg.resolved_loss_agg_mode,
            mini_batch_size=mini_batch_size,
            seed=self.config.trainer.seed + self._update_calls,
            device=self.device,
            prefix="actor",
        )
        if acfg.use_kl_loss:
            acc.add("actor/kl_coef", acfg.kl_loss_coef)
        if dcfg.enable:
            acc.add("actor/distill_coef", dcfg.coef)
        if recorded is not None:
            for key, value in own_old_log_prob_metrics(data, recorded).items():
                acc.add(key, value)
        release_memory()  # activations and gradients, before the next rollout
        metrics = acc.result()
        self._rollout_weights_stale = True
        if self.rollout.owns_weights:
            self.rollout.wake_up()
            metrics |= self._sync_rollout_weights()
            self.rollout.sleep()
        return metrics

    def _data_parallel_size(self) -> int:
        """Ranks that update on different rows: the world over the sequence-group size."""
        return getattr(self.engine, "data_parallel_size", self.world_size)

    def _actor_loss_fn(
        self, temperature: float, recorded: list | None = None
    ) -> Callable[..., Any]:
        """``loss_fn(module, micro_batch)`` of the actor: log-probs (and entropy, when it
        is weighted) of the micro-batch, then :func:`verl.algorithms.actor_loss`.

        ``recorded`` (a list): the micro-batches carry no ``old_log_probs``; the detached
        log-probs stand in for them, and ``(row_index, log_probs, entropy)`` of each
        micro-batch is appended (entropy computed, detached, for the metric)."""
        acfg = self.config.actor_rollout_ref.actor
        clip_low, clip_high = acfg.clip_ratio_bounds
        loss_agg_mode = acfg.resolved_loss_agg_mode
        loss_entry = POLICY_LOSSES.entry(acfg.policy_loss)
        policy_loss_fn = loss_entry.target
        # the clip settings the loss takes, plus its hyperparameters from policy_loss_kwargs
        policy_loss_kwargs = loss_entry.call_kwargs(
            {
                "clip_ratio_low": clip_low,
                "clip_ratio_high": clip_high,
                "clip_ratio_c": acfg.clip_ratio_c,
            },
            acfg.policy_loss_kwargs,
            "actor_rollout_ref.actor.policy_loss_kwargs",
        )
        # seq-mean-token-sum-norm divides by a constant; left to agg_loss's default it would
        # be each micro-batch's trimmed response width, and the gradient would depend on
        # the micro-batch split.
        scale_factor = acfg.loss_scale_factor
        if scale_factor is None:
            scale_factor = self.config.data.max_response_length
        dcfg = self.config.algorithm.distill
        distill_topk = dcfg.enable and DISTILL_ESTIMATORS.needs(dcfg.estimator, "needs_topk")
        if dcfg.enable and not dcfg.mix_task_reward:
            # distillation alone: the policy loss is computed for its metrics only
            task_loss_fn = policy_loss_fn

            def policy_loss_fn(**kwargs: Any) -> tuple[torch.Tensor, Any]:
                pg_loss, pg_metrics = task_loss_fn(**kwargs)
                return pg_loss.detach(), pg_metrics

        def loss_fn(module: torch.nn.Module, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
            b = mb.data.batch
            with_entropy = acfg.entropy_coeff != 0 or recorded is not None
            student_topk = None
            if distill_topk:
                # the full distribution: the sampled tokens', the top-k ids' and the entropy
                full = response_log_softmax(
                    module,
                    b["input_ids"],
                    b["attention_mask"],
                    b["position_ids"],
                    mb.response_len,
                    temperature,
                )
                labels = b["input_ids"][:, -mb.response_len :, None]
                log_prob = full.gather(-1, labels)[..., 0]
                student_topk = full.gather(-1, b["distill_topk_ids"])
                entropy = -(full.exp() * full).sum(-1) if with_entropy else None
            else:
                log_prob, entropy = compute_response_log_probs(
                    module,
                    b["input_ids"],
                    b["attention_mask"],
                    b["position_ids"],
                    response_len=mb.response_len,
                    temperature=temperature,
                    chunk_size=acfg.logprob_chunk_size,
                    calculate_entropy=with_entropy,
                    pack=acfg.pack_sequences,
                    share_prefix=acfg.share_prompt_prefix,
                )
            old_log_prob = b.get("old_log_probs")
            if recorded is not None:
                old_log_prob = log_prob.detach()
                recorded.append((b["row_index"], old_log_prob, entropy.detach()))
                if acfg.entropy_coeff == 0:
                    entropy = None  # computed for the metric only
            # forward_backward runs this under the engine's autocast; the loss terms use no
            # op autocast lowers (no matmul), so they stay float32.
            loss, metrics = actor_loss(
                log_prob,
                old_log_prob,
                b["advantages"],
                b["response_mask"],
                policy_loss_fn=policy_loss_fn,
                policy_loss_kwargs=policy_loss_kwargs,
                loss_agg_mode=loss_agg_mode,
                loss_scale_factor=scale_factor,
                entropy=entropy,
                entropy_coeff=acfg.entropy_coeff,
                ref_log_prob=b.get("ref_log_probs"),
                kl_loss_coef=acfg.kl_loss_coef,
                kl_loss_type=acfg.kl_loss_type,
                rollout_log_prob=b.get("rollout_log_probs"),
                rollout_is_threshold=acfg.rollout_is_threshold,
                rollout_is_level=acfg.rollout_is_level,
                rollout_rs_threshold=acfg.rollout_rs_threshold,
            )
            if dcfg.enable:
                if not dcfg.mix_task_reward:  # the (detached) policy loss leaves the value
                    loss = loss - metrics["pg_loss"]
                kl, kl_metrics = distill_loss(
                    log_prob.float(),
                    b["teacher_log_probs"],
                    b["response_mask"],
                    estimator=dcfg.estimator,
                    loss_agg_mode=loss_agg_mode,
                    loss_scale_factor=scale_factor,
                    student_topk_log_probs=student_topk,
                    teacher_topk_log_probs=b.get("teacher_topk_log_probs"),
                    topk_tail=dcfg.topk_tail,
                )
                loss = loss + dcfg.coef * kl
                metrics |= kl_metrics
            return loss, metrics

        return loss_fn

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
        sharded = self.config.engine_strategy("actor_rollout_ref") == "fsdp2"
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
        save_worker_checkpoint(
            self.engine,
            path,
            rank=self.rank,
            world_size=self.world_size,
            counters={"update_calls": self._update_calls, "generate_calls": self._generate_calls},
        )
        if hf_weights:
            if hf_config_dir is None:
                raise ValueError("hf_weights=True needs hf_config_dir")
            self.save_hf(hf_config_dir)
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
        self._generate_calls = counters["generate_calls"]
        self._rollout_weights_stale = True

"""What an offline run (SFT, DPO / IPO / KTO, RM) checkpoints, and how it resumes bit for bit.

The format is the RL trainer's (``verl.trainer.lifecycle.checkpoint``: atomic ``global_step_N``
directories with a CRC-32 manifest, the ``latest`` pointer, retention), with the trained
policy in the actor's place, so ``python -m verl.model_merger`` exports it too::

    global_step_N/
      actor/                   the policy engine: model, optimizer, LR schedule (single: one
                               set of files; fsdp2: sharded DCP) + worker_state_rank{r}.json
                               (RNG states) + huggingface/ (config and tokenizer, for export)
      trainer_state.json       step, data-loader epoch and position, the driver's RNG
      config.yaml              the resolved config
      checkpoint.json          manifest (written last): trainer kind, roles, files + CRC-32

Nothing else is needed for an exact continuation: the datasets are read (or the built-in
set regenerated) again, and DPO's reference log-probs are recomputed from the initial
model (``model.path``) before anything is loaded.

The offline trainers save and resume through the RL trainer's
:class:`~verl.trainer.lifecycle.resume.RunCheckpointer` (``OfflineTrainer.checkpointer``):
their progress and data loader are its components, the policy engine its one role through
:class:`LocalEngineRole` (the worker group's ``save_checkpoint`` / ``load_checkpoint`` over an
engine of this process; under torchrun or Ray each rank holds its shard and the ranks save
together), the trainer kind and :data:`OFFLINE_IDENTITY_KEYS` its parameters. What is left
here is what only the offline runs have. ``trainer.resume_mode`` and the refusal of a
checkpoint whose model, tokenizer, data or loss settings changed (overridden by
``trainer.resume_force``) work as for the RL trainer; see ``docs/checkpoints.md``.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from verl.workers.checkpointing import (
    load_worker_checkpoint,
    save_hf_metadata,
    save_worker_checkpoint,
)

__all__ = ["OFFLINE_IDENTITY_KEYS", "POLICY_ROLE", "LocalEngineRole"]

# The policy plays the actor's part: its directory and manifest entry are the actor's, so
# the export tool and the layout docs apply unchanged.
POLICY_ROLE = "actor_rollout_ref"

# Keys whose change makes resuming meaningless (another model or tokenizer, other rows
# behind the saved data position, another batch order, another loss); a key covers its
# section. Refused unless trainer.resume_force=true. Keys of the other trainer's schema are
# simply absent (a DPO checkpoint has algorithm.loss_type, an SFT config has not: refused).
OFFLINE_IDENTITY_KEYS = (
    "model.path",
    "model.tokenizer_path",
    "model.override_config",
    "data.train_files",
    "data.messages_key",
    "data.prompt_key",
    "data.response_key",
    "data.apply_chat_template",
    "data.max_length",
    "data.max_prompt_length",
    "data.truncation",
    "data.packing",
    "data.train_batch_size",
    "data.shuffle",
    "data.seed",
    "data.builtin",
    "data.arithmetic",
    "algorithm.loss_type",
    "trainer.project_name",
    "trainer.experiment_name",
)


class _SubmitNow:
    """A method with the worker group's ``.submit``: runs now, returns a finished future."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def submit(self, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(self.fn(*args, **kwargs))
        except Exception as err:
            future.set_exception(err)
        return future


class LocalEngineRole:
    """An engine of this process in a role's place: the checkpoint interface of a worker
    group (``world_size``, ``save_checkpoint`` with ``.submit``, ``load_checkpoint``).

    Args:
        engine: the policy's train engine (this rank's shard under fsdp2).
        tokenizer: written with the HF config for export (by rank 0).
        rank / world_size: this process's rank among the ranks that share the engine.

    Saving and loading are collective when the engine is sharded: every rank calls them.
    No call counters: an offline step draws nothing from them.
    """

    def __init__(self, engine: Any, tokenizer: Any, *, rank: int, world_size: int) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.rank = rank
        self.world_size = world_size
        self.save_checkpoint = _SubmitNow(self._save)

    def _save(self, path: str, hf_config_dir: str | None = None, hf_weights: bool = False) -> None:
        """This rank's share of the role's directory ``path`` (engine, RNG); rank 0 also
        writes the HF config and tokenizer to ``hf_config_dir``."""
        if hf_weights:
            raise ValueError(
                "LocalEngineRole: hf_weights (save_contents hf_model) is not offered by the "
                "offline trainers; their final model is exported at the end of the run"
            )
        save_worker_checkpoint(
            self.engine, path, rank=self.rank, world_size=self.world_size, counters={}
        )
        if hf_config_dir is not None and self.rank == 0:
            save_hf_metadata(self.engine.module, self.tokenizer, hf_config_dir)

    def load_checkpoint(self, path: str) -> None:
        """Restore the engine and this rank's generators (rank r gets rank r's when the
        number of ranks is the one saved)."""
        load_worker_checkpoint(self.engine, path, rank=self.rank, world_size=self.world_size)

"""What a run checkpoints, and how it resumes from a checkpoint bit for bit (RL and offline).

:class:`RunCheckpointer` composes the run's stateful parts, as the trainer hands them over
(it reads no trainer attribute): each trainable role (an RL worker group, whose workers write
the engine state, their RNG states and call counters, ``verl.workers.checkpointing``; or an
offline trainer's local engine behind the same ``save_checkpoint`` / ``load_checkpoint``
interface), and the driver-side components with ``state_dict()`` / ``load_state_dict()``: the
trainer's progress, the data-loader position, the KL controller, the reward normalisation
statistics. It writes them, the driver's RNG states and the resolved config through
``verl.trainer.lifecycle.checkpoint.CheckpointManager`` (atomic directories), and restores all
of it, the generators last. (DAPO dynamic sampling keeps no state across steps: the extra
prompt batches it draws are in the data-loader position.) Run by several driver processes
together (an offline trainer's ranks, :class:`Drivers`), every rank writes its engine shard
into the temporary directory rank 0 made and rank 0 alone writes the rest and the manifest.

``trainer.resume_mode`` (:func:`resume_checkpoint_path`): ``auto`` takes the newest complete
checkpoint under ``default_local_dir`` (none: a fresh start), ``resume_path`` the directory in
``trainer.resume_from_path``, ``disable`` none. A checkpoint written by another trainer (the
manifest's ``trainer``: absent for RL, ``sft`` / ``dpo`` / ``rm`` offline) is refused, and so
is one whose config differs in an identity key (:data:`RESUME_IDENTITY_KEYS` for RL, the model,
the tokenizer, the training data and its order; the offline trainers pass theirs) unless
``trainer.resume_force=true``; other differences are logged. A checkpoint of the single engine
cannot be re-sharded for fsdp2 and is refused there; fsdp2 checkpoints load on any number of
ranks. See ``docs/checkpoints.md``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from verl.config import TrainerConfig, to_yaml
from verl.config.load import iter_schema, section_class
from verl.trainer.lifecycle.checkpoint import (
    CONFIG_FILE,
    FORMAT_VERSION,
    HF_CONFIG_DIR,
    ROLE_DIRS,
    TRAINER_STATE_FILE,
    CheckpointError,
    CheckpointManager,
    read_manifest,
)
from verl.utils.atomic_io import write_json_atomic, write_text_atomic
from verl.utils.rng import rng_state, set_rng_state
from verl.utils.yaml_text import load_yaml_text

logger = logging.getLogger(__name__)

__all__ = [
    "ONE_DRIVER",
    "RESUME_IDENTITY_KEYS",
    "Drivers",
    "RoleSettings",
    "RunCheckpointer",
    "Stateful",
    "check_resume_config",
    "config_differences",
    "resume_checkpoint_path",
]

# Keys whose change makes resuming meaningless: the weights would be loaded into another
# model, the tokens would mean other things, or the data-loader position would index other
# prompts. Refused unless trainer.resume_force=true. A key covers its whole section.
RESUME_IDENTITY_KEYS = (
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.model.tokenizer_path",
    "actor_rollout_ref.model.override_config",
    "critic.model.path",
    "critic.model.override_config",
    "critic.enable",
    "algorithm.adv_estimator",
    "data.train_files",
    "data.rollout_files",
    "data.prompt_key",
    "data.max_prompt_length",
    "data.truncation",
    "data.apply_chat_template",
    "data.builtin",
    "data.arithmetic",
    "data.train_batch_size",
    "data.shuffle",
    "data.seed",
    # The run's name: a checkpoint of another experiment in the same directory is not this
    # run's past (two runs pointed at one directory).
    "trainer.project_name",
    "trainer.experiment_name",
)
# Keys that name the resume itself: never reported as differences.
_RESUME_KEYS = ("trainer.resume_mode", "trainer.resume_from_path", "trainer.resume_force")
_PATH_KEYS = (
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.model.tokenizer_path",
    "critic.model.path",
    "data.train_files",
    # the offline trainers' (SFT, DPO) model section
    "model.path",
    "model.tokenizer_path",
)


# ---------------------------------------------------------------------- config comparison


def _lookup(tree: Any, key: str) -> Any:
    """The value at dotted ``key`` of a parsed YAML tree; None where a section is absent."""
    node = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _normalised(key: str, value: Any) -> Any:
    """Existing paths compared by their real location, so ``./m`` equals ``/abs/m``."""
    if key not in _PATH_KEYS:
        return value
    if isinstance(value, list):
        return [_normalised(key, v) for v in value]
    if isinstance(value, str) and os.path.exists(value):
        return os.path.realpath(value)
    return value


def config_differences(saved_yaml: str, cfg: Any) -> list[tuple[str, Any, Any]]:
    """``(key, saved value, current value)`` of every config key that differs (the resume
    keys themselves excluded), in schema order. A dict-valued key (``override_config``) is
    one value; a key the saved config lacks (an older schema) counts as null."""
    saved, current = load_yaml_text(saved_yaml), load_yaml_text(to_yaml(cfg))
    out = []
    for key, _, tp in iter_schema(type(cfg)):
        if section_class(tp) is not None or key in _RESUME_KEYS:
            continue  # sections are compared key by key
        old, new = _lookup(saved, key), _lookup(current, key)
        if _normalised(key, old) != _normalised(key, new):
            out.append((key, old, new))
    return out


def _is_identity_key(key: str, identity_keys: tuple[str, ...]) -> bool:
    return any(key == k or key.startswith(k + ".") for k in identity_keys)


def check_resume_config(
    path: Path, cfg: Any, identity_keys: tuple[str, ...] = RESUME_IDENTITY_KEYS
) -> None:
    """Refuse a checkpoint whose ``identity_keys`` differ (unless ``trainer.resume_force``);
    log the other differences. ``cfg`` is any typed run config with a ``trainer`` section
    (the RL one by default; the offline trainers pass their own keys)."""
    differences = config_differences((path / CONFIG_FILE).read_text(), cfg)
    refused = [d for d in differences if _is_identity_key(d[0], identity_keys)]
    others = [d for d in differences if not _is_identity_key(d[0], identity_keys)]
    if others:
        logger.warning(
            "resuming %s with a changed config: %s",
            path,
            "; ".join(f"{k}: {old!r} -> {new!r}" for k, old, new in others),
        )
    if not refused:
        return
    listed = "; ".join(f"{k}: checkpoint {old!r}, now {new!r}" for k, old, new in refused)
    if cfg.trainer.resume_force:
        logger.warning("trainer.resume_force=true: resuming %s although %s", path, listed)
        return
    raise CheckpointError(
        f"refusing to resume from {path}: the config changed in keys that make resuming "
        f"meaningless ({listed}). Use the checkpoint's settings, start fresh "
        "(trainer.resume_mode=disable or another trainer.default_local_dir), or set "
        "trainer.resume_force=true to load it anyway"
    )


# ---------------------------------------------------------------------- the run's parts


@runtime_checkable
class Stateful(Protocol):
    """A component whose state a checkpoint holds: ``state_dict()`` returns JSON-able
    values, ``load_state_dict(state)`` restores them (the data loader, the KL controller,
    the reward managers' normalisers, the trainer's own progress)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Drivers(Protocol):
    """The driver processes that run one checkpointer together, SPMD (an offline trainer's
    ranks under torchrun or Ray, each with its own engine shard); ``broadcast`` and
    ``all_gather`` are collectives over them."""

    rank: int
    world_size: int

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        ...

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        ...


class _OneDriver:
    """One driver process (the RL trainer's driver, a one-process offline run)."""

    rank = 0
    world_size = 1

    def broadcast(self, obj: Any) -> Any:
        return obj

    def all_gather(self, obj: Any) -> list[Any]:
        return [obj]


ONE_DRIVER: Drivers = _OneDriver()


@dataclass(frozen=True)
class RoleSettings:
    """How a role's engine is set up, as its checkpoint records and checks it.

    Attributes:
        strategy: the engine strategy, ``single`` or ``fsdp2`` (in the manifest; a
            ``single`` checkpoint is refused by an ``fsdp2`` run).
        strategy_key: the config key that sets it, named in that refusal.
        hf_weights: write the whole model as a HF directory into the role's
            ``huggingface/`` (``save_contents`` has ``hf_model``); else its config and
            tokenizer only.
    """

    strategy: str
    strategy_key: str
    hf_weights: bool = False

    @classmethod
    def of_rl_role(cls, config: TrainerConfig, role: str) -> RoleSettings:
        """The settings of RL role ``role`` (``actor_rollout_ref``, ``critic``) in ``config``."""
        section = "actor_rollout_ref.actor" if role == "actor_rollout_ref" else role
        return cls(
            strategy=config.engine_strategy(role),
            strategy_key=f"{section}.strategy",
            hf_weights="hf_model" in config.trained_section(role).checkpoint.save_contents,
        )


def _state_of(obj: Any) -> dict[str, Any] | None:
    """``obj.state_dict()``, or None for a component without state (a custom reward fn)."""
    return obj.state_dict() if isinstance(obj, Stateful) else None


class RunCheckpointer:
    """Saves and restores a run composed of stateful parts; knows no trainer.

    Args:
        config: the run's config (written with the checkpoint, compared on resume); any
            typed run config with a ``trainer`` section (RL or offline).
        manager: the atomic checkpoint directories.
        progress: the run's own counters (``state_dict()`` gives ``global_step``, written at
            the top of ``trainer_state.json``).
        components: driver-side parts by name (``dataloader``, ``kl_ctrl``, ``reward_fn``
            ...), each saved under its name; one without ``state_dict`` is saved as null.
            One with ``save_files(dir)`` / ``load_files(dir)`` also keeps files in the
            checkpoint's directory ``<name>/`` (the asynchronous rollout's in-flight batches).
        roles: the trainable roles by role name; each writes its own directory: an object
            with ``world_size`` (its ranks), ``save_checkpoint.submit(dir, hf_config_dir=,
            hf_weights=)`` returning a future and ``load_checkpoint(dir)`` (an RL worker
            group, whose workers write engine, RNG and call counters,
            ``verl.workers.checkpointing``; or an adapter over a local engine).
        role_settings: each role's :class:`RoleSettings` (default: read from the RL config,
            :meth:`RoleSettings.of_rl_role`).
        kind: the trainer that writes and may resume these checkpoints (``sft``, ``dpo``,
            ``rm``; None for RL), recorded as ``trainer`` in the manifest and the state;
            a checkpoint of another kind is refused.
        identity_keys: config keys whose change refuses a resume (unless
            ``trainer.resume_force``): :data:`RESUME_IDENTITY_KEYS` for RL.
        drivers: the processes running this checkpointer together (default: one). Saving
            is then collective: rank 0 makes the temporary directory, every rank writes its
            roles' shards into it, rank 0 writes the rest once all are in; loading restores
            every part on every rank and the driver's RNG on rank 0 (the other ranks get
            theirs from their roles' worker state).

    Loading restores the roles, then the progress and the components in the order given,
    then the driver's random generators (last: nothing may move them afterwards).
    """

    def __init__(
        self,
        config: Any,
        manager: CheckpointManager,
        *,
        progress: Stateful,
        components: Mapping[str, Any],
        roles: Mapping[str, Any],
        role_settings: Mapping[str, RoleSettings] | None = None,
        kind: str | None = None,
        identity_keys: tuple[str, ...] = RESUME_IDENTITY_KEYS,
        drivers: Drivers = ONE_DRIVER,
    ) -> None:
        clash = {"format_version", "trainer", "rng"} & set(components)
        if clash:
            raise ValueError(f"RunCheckpointer: component names {sorted(clash)} are reserved")
        if role_settings is None:
            role_settings = {role: RoleSettings.of_rl_role(config, role) for role in roles}
        missing = set(roles) - set(role_settings)
        if missing:
            raise ValueError(f"RunCheckpointer: no role_settings for {sorted(missing)}")
        self.config = config
        self.manager = manager
        self.progress = progress
        self.components = dict(components)
        self.roles = dict(roles)
        self.role_settings = dict(role_settings)
        self.kind = kind
        self.identity_keys = identity_keys
        self.drivers = drivers

    # ------------------------------------------------------------------ save
    def save(self, step: int) -> Path:
        """Write the complete state after step ``step`` (atomically); returns the path.

        Collective over :attr:`drivers`: every rank returns once the checkpoint is in place,
        or raises :class:`CheckpointError` if the save failed (on any rank).
        """
        drivers = self.drivers
        if drivers.world_size == 1:
            return self.manager.save(step, self._write)
        if drivers.rank != 0:
            # Rank 0 sends the temporary directory ("" when it failed before), then the
            # checkpoint's path once the manifest is in ("" when the save failed).
            tmp = drivers.broadcast(None)
            if not tmp:
                raise CheckpointError(f"rank 0 failed to save checkpoint {step}")
            try:
                self._save_roles(Path(tmp))
            except Exception:
                drivers.broadcast(None)  # rank 0's "": it failed the save as well
                raise
            final = drivers.broadcast(None)
            if not final:
                raise CheckpointError(f"rank 0 failed to save checkpoint {step}")
            return Path(final)
        try:
            path = self.manager.save(step, self._write)
        except BaseException:
            drivers.broadcast("")
            raise
        drivers.broadcast(str(path))
        return path

    def _write(self, tmp: Path) -> dict[str, Any]:
        """Fill the temporary directory ``tmp`` (rank 0); returns the manifest's fields."""
        # The driver's generators first; the roles' saves leave every generator untouched.
        state: dict[str, Any] = {"format_version": FORMAT_VERSION}
        if self.kind is not None:
            state["trainer"] = self.kind
        state |= self.progress.state_dict()
        state |= {name: _state_of(obj) for name, obj in self.components.items()}
        for name, obj in self.components.items():  # tensors: files of their own
            if hasattr(obj, "save_files"):
                obj.save_files(tmp / name)
        state["rng"] = rng_state()
        self.drivers.broadcast(str(tmp))
        roles = self._save_roles(tmp)
        write_json_atomic(tmp / TRAINER_STATE_FILE, state)
        write_text_atomic(tmp / CONFIG_FILE, to_yaml(self.config))
        extra: dict[str, Any] = {} if self.kind is None else {"trainer": self.kind}
        return extra | {"roles": roles}

    def _save_roles(self, tmp: Path) -> dict[str, Any]:
        """This rank's share of every role's directory under ``tmp``; the roles' manifest
        entries. With several drivers the ranks then agree (reached on a failure too): when
        any rank's share failed, every rank raises, so that rank 0 never writes the manifest
        of a checkpoint with a missing shard."""
        roles: dict[str, Any] = {}
        pending: list[Any] = []
        errors: list[Exception] = []
        failed: list[tuple[int, str]] = []
        try:
            for role, group in self.roles.items():
                role_dir = tmp / ROLE_DIRS[role]
                settings = self.role_settings[role]
                # Submitted together: roles on pools of their own write at the same time.
                try:
                    future = group.save_checkpoint.submit(
                        str(role_dir),
                        hf_config_dir=str(role_dir / HF_CONFIG_DIR),
                        hf_weights=settings.hf_weights,
                    )
                except Exception as err:
                    errors.append(err)
                    break
                pending.append(future)
                roles[role] = {
                    "dir": ROLE_DIRS[role],
                    "world_size": group.world_size,
                    "strategy": settings.strategy,
                }
            # Wait for every role before reporting a failure, so that none is still writing
            # into the temporary directory when it is removed.
            for future in pending:
                try:
                    future.result()
                except Exception as err:
                    errors.append(err)
        finally:
            if self.drivers.world_size > 1:  # every rank's files are in (or it failed)
                own = f"{type(errors[0]).__name__}: {errors[0]}" if errors else ""
                reports = self.drivers.all_gather(own)
                failed = [(rank, report) for rank, report in enumerate(reports) if report]
        if errors:
            raise errors[0]
        if failed:
            listed = "; ".join(f"rank {rank}: {report}" for rank, report in failed)
            raise CheckpointError(f"writing the roles' shards failed on another rank ({listed})")
        return roles

    # ------------------------------------------------------------------ load
    def load(self, path: str | os.PathLike[str], verify: bool = True) -> None:
        """Restore every part from checkpoint ``path`` (each file's CRC-32 checked first
        unless ``verify=False``, where the caller just did). Every driver rank calls it."""
        path = Path(path)
        manifest = read_manifest(path, verify=verify)
        self._check_kind(path, manifest)
        check_resume_config(path, self.config, self.identity_keys)
        self._check_roles(path, manifest)
        state = json.loads((path / TRAINER_STATE_FILE).read_text())
        for role, group in self.roles.items():
            if role in manifest["roles"]:
                role_dir = path / manifest["roles"][role]["dir"]
                try:
                    group.load_checkpoint(str(role_dir))
                except Exception as err:
                    if not _unreadable_file(err):
                        raise
                    raise CheckpointError(
                        f"checkpoint {path}: the {role} files under {role_dir} cannot be read "
                        f"(truncated or damaged after the manifest was written?): {err}"
                    ) from err
        self.progress.load_state_dict(state)
        for name, obj in self.components.items():
            saved = state.get(name)
            if saved is None or not isinstance(obj, Stateful):
                continue
            try:
                obj.load_state_dict(saved)
            except ValueError as err:
                if name != "dataloader" or not self.config.trainer.resume_force:
                    raise CheckpointError(f"checkpoint {path}: {name}: {err}") from err
                _relaxed_data_position(obj, saved, err)
            if hasattr(obj, "load_files"):
                obj.load_files(path / name)
        if self.drivers.rank == 0:
            # Last: nothing above may move the restored generators. The other ranks got
            # theirs back with their roles' worker state.
            set_rng_state(state["rng"])
        logger.info("resumed from %s at step %s", path, state.get("global_step"))

    def _check_kind(self, path: Path, manifest: dict[str, Any]) -> None:
        """Refuse a checkpoint written by another trainer (RL, SFT, DPO, RM)."""
        saved = manifest.get("trainer")
        if saved == self.kind:
            return
        saved_by = f"the {saved} trainer" if saved else "the RL trainer"
        this = f"the {self.kind} trainer" if self.kind else "the RL trainer"
        raise CheckpointError(
            f"checkpoint {path} was saved by {saved_by}, not by {this}; resume it with the "
            "trainer that wrote it, or start fresh (trainer.resume_mode=disable or another "
            "trainer.default_local_dir)"
        )

    def _check_roles(self, path: Path, manifest: dict[str, Any]) -> None:
        saved = manifest["roles"]
        for role, group in self.roles.items():
            if role not in saved:
                if self.config.trainer.resume_force:
                    logger.warning("checkpoint %s has no %s state: it starts fresh", path, role)
                    continue
                raise CheckpointError(
                    f"checkpoint {path} has no {role} state but this run uses a {role}; start "
                    f"fresh, or set trainer.resume_force=true to start the {role} from scratch"
                )
            settings = self.role_settings[role]
            size, new_size = saved[role]["world_size"], group.world_size
            if saved[role]["strategy"] == "single" and settings.strategy == "fsdp2":
                raise CheckpointError(
                    f"checkpoint {path}: {role} was saved by the single-process engine "
                    f"(world size {size}) and this run uses fsdp2 on {new_size} rank(s); only "
                    "sharded fsdp2 checkpoints can be re-sharded. Resume with one process and "
                    f"{settings.strategy_key}=single, or train with strategy=fsdp2 from the "
                    "start"
                )
            if size != new_size:
                logger.warning(
                    "checkpoint %s: %s was saved by %d rank(s) and is re-sharded to %d; "
                    "training continues correctly but not bit for bit (other random streams "
                    "and batch split)",
                    path,
                    role,
                    size,
                    new_size,
                )
        for role in saved:
            if role not in self.roles:
                logger.warning("checkpoint %s has %s state that this run does not use", path, role)


# What the readers of a truncated or damaged file say (safetensors, torch.load's zip reader);
# matched in the text too, since a Ray worker's error arrives wrapped.
_UNREADABLE = ("Error while deserializing", "SafetensorError", "PytorchStreamReader failed")


def _unreadable_file(err: BaseException) -> bool:
    """Whether ``err`` (or what caused it) is a reader refusing a truncated / damaged file."""
    seen: BaseException | None = err
    while seen is not None:
        if type(seen).__name__ == "SafetensorError" or any(m in str(seen) for m in _UNREADABLE):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _relaxed_data_position(loader: Stateful, saved: dict[str, Any], err: ValueError) -> None:
    """With ``resume_force`` and other batching settings: keep the saved epoch and position
    as far as they fit the new batching."""
    sampler = saved["sampler"]
    epoch, position = int(sampler["epoch"]), int(sampler["position"])
    if position > len(loader):  # type: ignore[arg-type]
        epoch, position = epoch + 1, 0
    loader.load_state_dict({"sampler": {"epoch": epoch, "position": position}})
    logger.warning(
        "trainer.resume_force=true: the data order changed (%s); continuing at epoch %d, "
        "batch %d of the new order",
        err,
        epoch,
        position,
    )


def resume_checkpoint_path(cfg: Any, manager: CheckpointManager) -> Path | None:
    """The checkpoint ``trainer.resume_mode`` asks for, or None for a fresh start (``cfg``:
    any run config whose ``trainer`` section has the resume keys, RL or offline).

    Raises:
        CheckpointError: ``resume_path`` names a missing, incomplete or damaged checkpoint
            (``auto`` sets damaged ones aside and takes the newest intact one instead).
    """
    t = cfg.trainer
    if t.resume_mode == "disable":
        existing = manager.latest()
        if existing is not None:
            logger.warning(
                "trainer.resume_mode=disable: starting fresh although %s exists; this run's "
                "checkpoints go to the same directory and replace those of equal steps",
                existing,
            )
        return None
    if t.resume_mode == "resume_path":
        if not t.resume_from_path:
            raise CheckpointError(
                "trainer.resume_mode=resume_path needs trainer.resume_from_path (a "
                "global_step_N directory)"
            )
        path = Path(os.path.expanduser(t.resume_from_path))
        read_manifest(path, verify=True)  # a clear error for a missing / damaged directory
        return path
    if t.resume_mode == "auto":
        found = manager.newest_verified()
        if found is None:
            logger.info("no complete checkpoint under %s: starting fresh", manager.root)
        return found
    raise CheckpointError(
        f"trainer.resume_mode={t.resume_mode!r}: use auto, disable or resume_path"
    )

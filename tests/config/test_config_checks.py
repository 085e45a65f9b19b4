"""The semantic checks of a config live with the features that read it and are registered
in ``verl.registry.CONFIG_CHECKS``: a bare ``load_config`` / ``cfg.validate()`` /
``load_sft_config`` in a fresh process (no trainer imported) still runs every one of them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from verl.registry import CONFIG_CHECKS

_SCRIPT = textwrap.dedent(
    """
    import sys
    from verl.config import ConfigError, TrainerConfig, load_config, load_dpo_config

    assert not [m for m in sys.modules if m.startswith("verl.trainer")], "trainer imported"

    def message(load):
        try:
            load()
        except ConfigError as err:
            return str(err)
        raise AssertionError("no ConfigError")

    def weight_only_actor():
        cfg = TrainerConfig()
        cfg.actor_rollout_ref.actor.precision = "fp8"
        cfg.validate()

    print(message(lambda: load_config(overrides=["trainer.partial_rollout=continue"])))
    print(message(lambda: load_config(overrides=["reward_model.clip_range=[1, 0]"])))
    print(message(weight_only_actor))
    print(message(lambda: load_config(overrides=["trainer.resume_mode=resume_path"])))
    print(message(lambda: load_dpo_config(
        overrides=["algorithm.loss_type=ipo", "algorithm.label_smoothing=0.1"])))
    print("torch" in sys.modules)
    """
)


def test_every_config_class_has_its_checks_registered():
    for name in ("TrainerConfig", "SFTConfig", "DPOConfig", "RMConfig"):
        assert name in CONFIG_CHECKS
        assert callable(CONFIG_CHECKS.get(name).problems)
    assert CONFIG_CHECKS.get("TrainerConfig").resolve is not None


def test_bare_loading_and_validation_run_the_moved_checks():
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=True, timeout=120
    ).stdout.splitlines()
    async_msg, reward_msg, precision_msg, run_msg, dpo_msg, torch_imported = out
    assert "trainer.partial_rollout=continue loads new weights" in async_msg  # async_checks
    assert "reward_model.clip_range=[1.0, 0.0]: must be [lo, hi]" in reward_msg  # reward_checks
    assert "actor_rollout_ref.actor.precision=fp8: fp8 is weight-only" in precision_msg
    assert "trainer.resume_from_path is null" in run_msg  # the shared run checks
    assert "only the dpo loss uses it" in dpo_msg  # the offline trainers' checks
    assert torch_imported == "False"  # the checks themselves import no torch

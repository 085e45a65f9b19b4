"""Two spellings of one key, and what a YAML file may cost to load.

An alias (tutorial or upstream key) and its native key, or two aliases of one key, must
agree in a YAML file and on the command line alike, with one message naming both keys
and values; upstream's ``data.filter_overlong_prompts=True`` beside ``data.truncation=error``
means drop, as upstream reads it. A YAML file's aliases cannot expand it past a bound, and
a value quoted in an error message is cut short.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import yaml

from verl.config import ConfigError, TrainerConfig, load_config, load_sft_config
from verl.utils.yaml_text import MAX_ALIAS_EXPANSION, SHOW_LIMIT, show


def _yaml(tmp_path: Path, overrides: list[str]) -> Path:
    """The overrides written as one YAML file."""
    tree: dict = {}
    for override in overrides:
        key, raw = override.split("=", 1)
        *parents, last = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(raw)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def _refusal(**where) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(**where)
    assert len(err.value.problems) == 1, err.value
    return err.value.problems[0].message


# --- data.filter_overlong_prompts with data.truncation ------------------------------------

FILTER = "data.filter_overlong_prompts=True"


@pytest.mark.parametrize("truncation", ["error", "left"])
def test_filter_with_truncation_error_drops_as_upstream_does(tmp_path, caplog, truncation):
    """Upstream filters long prompts out, then truncates what remains (nothing): drop, in
    either order, on the command line and in a YAML file, with one INFO note."""
    script = [FILTER, f"data.truncation={truncation}"]
    for overrides in (script, script[::-1]):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="verl.compat"):
            assert load_config(overrides=overrides).data.truncation == "drop"
        infos = [r for r in caplog.records if r.levelno == logging.INFO]
        assert len(infos) == 1, [r.getMessage() for r in infos]
        assert "data.filter_overlong_prompts" in infos[0].getMessage()
        assert f"data.truncation={truncation}" in infos[0].getMessage()
    assert load_config(_yaml(tmp_path, script)).data.truncation == "drop"


def test_filter_alone_and_filter_false():
    assert load_config(overrides=[FILTER]).data.truncation == "drop"
    assert load_config(overrides=[FILTER, "data.truncation=drop"]).data.truncation == "drop"
    off = ["data.filter_overlong_prompts=False", "data.truncation=truncate"]
    assert load_config(overrides=off).data.truncation == "truncate"


def test_filter_with_truncate_is_refused_naming_both_keys(tmp_path):
    """``truncate`` keeps a long prompt's end, the filter drops it: no one meaning."""
    script = [FILTER, "data.truncation=truncate"]
    on_the_command_line = _refusal(overrides=script)
    in_a_file = _refusal(path=_yaml(tmp_path, script))
    assert "data.filter_overlong_prompts=True (sets data.truncation='drop')" in in_a_file
    assert "data.truncation='truncate'" in in_a_file
    assert on_the_command_line == in_a_file


# --- an alias and its native key ----------------------------------------------------------


@pytest.mark.parametrize(
    "script, names",
    [
        (  # an upstream alias and its native key
            [
                "actor_rollout_ref.actor.pack_sequences=false",
                "actor_rollout_ref.model.use_remove_padding=true",
            ],
            [
                "actor_rollout_ref.actor.pack_sequences=False",
                "actor_rollout_ref.model.use_remove_padding=True",
            ],
        ),
        (  # two upstream aliases of one key
            ["trainer.max_actor_ckpt_to_keep=3", "trainer.max_critic_ckpt_to_keep=2"],
            ["trainer.max_actor_ckpt_to_keep=3", "trainer.max_critic_ckpt_to_keep=2"],
        ),
        (  # *_per_gpu and *_per_device
            ["critic.ppo_micro_batch_size_per_gpu=2", "critic.ppo_micro_batch_size_per_device=4"],
            ["critic.ppo_micro_batch_size_per_gpu=2", "critic.ppo_micro_batch_size_per_device=4"],
        ),
    ],
)
def test_two_spellings_disagreeing_are_refused_in_both_places(tmp_path, script, names):
    on_the_command_line = _refusal(overrides=script)
    in_a_file = _refusal(path=_yaml(tmp_path, script))
    assert on_the_command_line == in_a_file
    for name in names:
        assert name in in_a_file
    assert "set the same key; give one of them" in in_a_file


def test_agreeing_spellings_and_plain_overrides_load(tmp_path):
    agree = [
        "actor_rollout_ref.actor.pack_sequences=true",
        "actor_rollout_ref.model.use_remove_padding=true",
    ]
    assert load_config(overrides=agree).actor_rollout_ref.actor.pack_sequences is True
    assert load_config(_yaml(tmp_path, agree)).actor_rollout_ref.actor.pack_sequences is True
    # the same key twice on the command line: the last wins, as in Hydra
    twice = ["actor_rollout_ref.model.use_remove_padding=false"] * 1 + [
        "actor_rollout_ref.model.use_remove_padding=true"
    ]
    assert load_config(overrides=twice).actor_rollout_ref.actor.pack_sequences is True
    # a command-line key, in any spelling, overrides the file's
    path = _yaml(tmp_path, ["actor_rollout_ref.actor.pack_sequences=false"])
    cfg = load_config(path, overrides=["actor_rollout_ref.model.use_remove_padding=true"])
    assert cfg.actor_rollout_ref.actor.pack_sequences is True


def test_a_refused_key_is_the_only_problem_of_its_file(tmp_path):
    """The file's other aliases are still translated: not reported as unknown keys."""
    path = _yaml(
        tmp_path,
        [
            "actor_rollout_ref.actor.fsdp_config.fsdp_size=4",
            "actor_rollout_ref.model.use_remove_padding=true",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "trainer.max_actor_ckpt_to_keep=3",
            "trainer.fsdp_init=false",
        ],
    )
    message = _refusal(path=path)
    assert "actor_rollout_ref.actor.fsdp_config.fsdp_size=4" in message
    assert "hybrid sharding" in message


def test_a_per_gpu_key_with_no_per_device_key_is_unknown_as_written(caplog):
    """``*_per_gpu`` is renamed only onto a ``*_per_device`` key the schema has."""
    with caplog.at_level(logging.WARNING, logger="verl.compat"):
        message = _refusal(overrides=["data.batch_size_per_gpu=1"])
    assert message.startswith("data.batch_size_per_gpu: unknown key")
    assert "batch_size_per_device" not in message + caplog.text
    # one that exists is still renamed (SFT's data.micro_batch_size_per_device)
    cfg = load_sft_config(overrides=["data.micro_batch_size_per_gpu=2"])
    assert cfg.data.micro_batch_size_per_device == 2


def test_trainer_config_with_an_unknown_keyword_names_the_nearest_keys():
    with pytest.raises(TypeError) as err:
        TrainerConfig(batch_size_per_gpu=1)
    text = str(err.value)
    assert text.startswith("TrainerConfig(): unknown keyword batch_size_per_gpu=1; did you mean")
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_device" in text
    assert "flat keys (mixed_precision" in text and "load_config(overrides=" in text


FP32 = {"bfloat16": "float32", "torch.bfloat16": "torch.float32", "bf16": "fp32"}


@pytest.mark.parametrize("spelled", list(FP32))
def test_a_dtype_written_as_text_is_a_precision(tmp_path, spelled):
    """Where a torch dtype and ``bf16`` are accepted, so are ``"bfloat16"`` and
    ``"torch.bfloat16"``; elsewhere (free-form model config) the text stays as written."""
    cfg = TrainerConfig(mixed_precision=spelled, model_precision_map={"reward": spelled})
    assert cfg.trainer.mixed_precision == "bf16"
    assert cfg.trainer.model_precision_map == {"reward": "bf16"}
    assert cfg.actor_rollout_ref.actor.precision == "bf16"
    script = [
        f"trainer.mixed_precision={spelled}",
        f"critic.model.dtype={FP32[spelled]}",
        f"actor_rollout_ref.model.override_config={{torch_dtype: {spelled}}}",
    ]
    for loaded in (load_config(overrides=script), load_config(_yaml(tmp_path, script))):
        assert loaded.trainer.mixed_precision == "bf16"
        assert loaded.critic.model.dtype == "fp32"
        assert loaded.actor_rollout_ref.model.override_config == {"torch_dtype": spelled}
    assert load_sft_config(overrides=[f"model.dtype={spelled}"]).model.dtype == "bf16"


# --- what a YAML file may cost ------------------------------------------------------------


def _laughs(levels: int) -> str:
    """Nested anchors: ``levels`` lists of ten aliases of the one before, 10**levels ints."""
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    lines.append(f"data: {{train_batch_size: [{', '.join([f'*a{levels - 1}'] * 10)}]}}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("levels", [6, 7])
def test_an_alias_bomb_is_refused_at_once_naming_the_file(tmp_path, levels):
    path = tmp_path / "laughs.yaml"
    path.write_text(_laughs(levels))
    assert len(path.read_bytes()) < 600
    start = time.perf_counter()
    message = _refusal(path=path)
    assert time.perf_counter() - start < 2.0
    assert str(path) in message and f"limit of {MAX_ALIAS_EXPANSION}" in message
    assert "billion laughs" in message


def test_modest_and_recursive_aliases(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text("data:\n  train_files: &files [a.jsonl, b.jsonl]\n  val_files: *files\n")
    with pytest.raises(ConfigError) as err:  # the files do not exist: the anchors loaded
        load_config(path)
    assert "file 'a.jsonl' does not exist" in str(err.value)
    assert "data.val_files: file 'b.jsonl' does not exist" in str(err.value)
    path.write_text("data:\n  train_files: &loop [*loop]\n")
    assert "recursive" in _refusal(path=path)


def test_a_value_quoted_in_a_message_is_cut(tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump({"data": {"train_batch_size": list(range(50_000))}}))
    message = _refusal(path=path)
    assert len(message) < SHOW_LIMIT + 200, message
    assert message.startswith("data.train_batch_size=[0, 1, 2") and "49980 more" in message
    assert show("x" * 10_000).endswith("... (cut)") and len(show("x" * 10_000)) < 220
    assert show([1, 2]) == "[1, 2]"

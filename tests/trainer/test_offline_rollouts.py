"""Training from pre-generated rollouts (``data.rollout_files``, verl.trainer.rl.offline_rollouts):
``verl generate`` writes them, the trainer trains from them with the stored log-probs as the
behaviour policy of the rollout correction."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl import cli
from verl.config import ConfigError
from verl.data import DatasetValidationError
from verl.data.arithmetic import write_arithmetic_dataset
from verl.trainer.rl.trainer import RLTrainer

OFFLINE = (
    "actor_rollout_ref.actor.rollout_is_threshold=2.0",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
)


@pytest.fixture
def rollout_file(tiny_model_dir, tmp_path):
    """``verl generate``: 8 arithmetic prompts x 2 sampled responses of <= 6 tokens."""
    train, _ = write_arithmetic_dataset(tmp_path / "data", 8, 2, 1, ["+"], 0, "parquet", "chat")
    out = tmp_path / "gens.parquet"
    args = ["generate", "--model", str(tiny_model_dir), "--data", str(train), "--n", "2"]
    args += ["--max-new-tokens", "6", "--seed", "3", "-o", str(out)]
    assert cli.main(args) == 0
    return out


def _shifted(src, dst, shift):
    """A copy of the rollout file ``src`` with every stored log-prob moved by ``shift``."""
    rows = pq.read_table(src).to_pylist()
    for row in rows:
        row["response_token_log_probs"] = [
            [lp + shift for lp in lps] for lps in row["response_token_log_probs"]
        ]
    pq.write_table(pa.Table.from_pylist(rows), dst)
    return dst


def _train(rl_config, path, *extra):
    trainer = RLTrainer(rl_config(f"data.rollout_files=[{path}]", *OFFLINE, *extra))
    try:
        batch = next(iter(trainer.train_loader))
        gen, _ = trainer.collect_data(batch)
        trainer.fit()
        return trainer, gen, trainer.history
    finally:
        trainer.close()


@pytest.mark.slow
def test_generate_then_train_two_steps_from_the_file(rl_config, rollout_file, tmp_path):
    rows = pq.read_table(rollout_file).to_pylist()
    trainer, gen, history = _train(rl_config, rollout_file)
    assert len(history) == 2 and trainer.global_step == 2
    # the rollout batch is the file's rows: ids, log-probs and scores, nothing generated
    by_prompt = {tuple(r["prompt_token_ids"]): r for r in rows}
    mask = gen.batch["response_mask"].bool()
    prompt_mask = gen.batch["attention_mask"][:, : gen.batch["prompts"].shape[1]].bool()
    for i in range(len(gen)):
        row = by_prompt[tuple(gen.batch["prompts"][i][prompt_mask[i]].tolist())]
        j = i % 2
        assert gen.batch["responses"][i][mask[i]].tolist() == row["response_token_ids"][j]
        stored = gen.batch["rollout_log_probs"][i][mask[i]].tolist()
        assert stored == pytest.approx(row["response_token_log_probs"][j], abs=1e-6)
        assert gen.non_tensor_batch["score"][i] == row["scores"][j]
        assert gen.batch["token_level_scores"][i].sum().item() == pytest.approx(row["scores"][j])
    # step 1 trains the model that generated the file: the recomputed old log-probs equal
    # the stored ones, so every importance weight is 1
    first = history[0]
    assert first["actor/rollout_is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    assert first["actor/rollout_is_clipfrac"] == 0.0


@pytest.mark.slow
def test_the_loss_uses_the_stored_log_probs(rl_config, rollout_file, tmp_path):
    # stored log-probs lowered by log(1.5): the behaviour policy gave each token 1/1.5 of
    # the trained policy's probability, so each token's weight is min(1.5, 2.0) = 1.5
    shifted = _shifted(rollout_file, tmp_path / "shifted.parquet", -math.log(1.5))
    _, _, history = _train(rl_config, shifted)
    assert history[0]["actor/rollout_is_weight_mean"] == pytest.approx(1.5, abs=2e-3)
    # lowered by log(4): weights exp(log 4) = 4 are truncated at the threshold 2
    far = _shifted(rollout_file, tmp_path / "far.parquet", -math.log(4.0))
    _, _, history = _train(rl_config, far)
    assert history[0]["actor/rollout_is_weight_mean"] == pytest.approx(2.0, abs=1e-4)
    assert history[0]["actor/rollout_is_clipfrac"] == 1.0


def test_a_file_without_the_columns_names_the_file_and_the_column(rl_config, tmp_path):
    path = tmp_path / "prompts.parquet"
    rows = [{"prompt_token_ids": [1, 2], "scores": [1.0, 0.0], "response_token_ids": [[3], [4]]}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(DatasetValidationError) as err:
        RLTrainer(rl_config(f"data.rollout_files=[{path}]", *OFFLINE))
    msg = str(err.value)
    assert f"{path}: not a rollout file, missing column(s) response_token_log_probs" in msg
    assert "the files `verl generate` writes" in msg


def test_rows_that_do_not_fit_the_run_are_refused_by_row(rl_config, tmp_path):
    path = tmp_path / "gens.jsonl"
    good = {
        "prompt_token_ids": [1, 2],
        "response_token_ids": [[3], [4, 5]],
        "response_token_log_probs": [[-0.1], [-0.2, -0.3]],
        "scores": [1.0, 0.0],
    }
    three = dict(good, response_token_ids=[[3], [4], [5]])
    short = dict(good, response_token_log_probs=[[-0.1], [-0.2]])
    hot = dict(good, temperature=0.7)
    import json

    path.write_text("\n".join(json.dumps(r) for r in (good, three, short, hot)) + "\n")
    with pytest.raises(DatasetValidationError) as err:
        RLTrainer(rl_config(f"data.rollout_files=[{path}]", *OFFLINE))
    msg = str(err.value)
    assert f"{path} line 2: response_token_ids has 3 responses, but actor_rollout_ref" in msg
    assert f"{path} line 3: response 1: 2 token ids but 1 log-probs" in msg
    assert f"{path} line 4: log-probs at temperature 0.7" in msg
    assert "line 1" not in msg


def test_config_needs_the_rollout_correction_and_no_train_files(rl_config, tmp_path):
    path = tmp_path / "gens.parquet"
    path.write_bytes(b"")
    with pytest.raises(ConfigError) as err:
        rl_config(f"data.rollout_files=[{path}]")
    assert "set actor_rollout_ref.actor.rollout_is_threshold (e.g. 2.0)" in str(err.value)
    with pytest.raises(ConfigError) as err:
        rl_config(f"data.rollout_files=[{path}]", f"data.train_files=[{path}]", *OFFLINE)
    assert "data.rollout_files and data.train_files are both set" in str(err.value)
    with pytest.raises(ConfigError, match=r"remax.*does not generate"):
        rl_config(f"data.rollout_files=[{path}]", "algorithm.adv_estimator=remax", *OFFLINE)

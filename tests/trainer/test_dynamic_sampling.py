"""DAPO dynamic sampling: the helper with a scripted generate function, then the trainer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.config import load_config
from verl.models.tiny import save_tiny_model_dir
from verl.protocol import DataProto
from verl.rewards.placement import place_on_last_token
from verl.trainer.rl.dynamic_sampling import (
    collect_informative_groups,
    filter_metric_values,
    merge_step_metrics,
)
from verl.trainer.rl.trainer import RLTrainer

N = 2  # responses per prompt
R = 3  # response length
PAD = 0

# Per prompt kind, the (acc, shaped score) of its N responses.
SCRIPT = {
    "right": [(1.0, 1.0), (1.0, 1.0)],
    "wrong": [(0.0, 0.0), (0.0, 0.0)],
    "mixed": [(1.0, 1.0), (0.0, 0.0)],
    # both correct, but one was cut short by an overlong penalty: same acc, different reward
    "penalised": [(1.0, 1.0), (1.0, 0.5)],
}


def prompts(kinds: list[str], width: int, first_id: int) -> DataProto:
    """A left-padded prompt batch; prompt i has ``i % width + 1`` real tokens."""
    rows = len(kinds)
    mask = torch.zeros(rows, width, dtype=torch.long)
    for i in range(rows):
        mask[i, width - (i % width + 1) :] = 1
    ids = torch.where(mask.bool(), torch.full_like(mask, 7), PAD)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        },
        non_tensors={
            "kind": np.array(kinds, dtype=object),
            "prompt_id": np.arange(first_id, first_id + rows),
        },
    )


class ScriptedGenerate:
    """Stands in for ``RLTrainer.generate_and_score``: N scored responses per prompt."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, batch: DataProto) -> tuple[DataProto, dict[str, float]]:
        self.calls += 1
        batch.non_tensor_batch["uid"] = np.array(
            [f"call{self.calls}-{i}" for i in range(len(batch))], dtype=object
        )
        gen = batch.repeat(N, interleave=True)
        rows = len(gen)
        scripted = [SCRIPT[k][j % N] for j, k in enumerate(gen.non_tensor_batch["kind"])]
        scores = torch.zeros(rows, R)
        scores[:, -1] = torch.tensor([s for _, s in scripted])
        response_mask = torch.ones(rows, R, dtype=torch.long)
        gen.batch["prompts"] = gen.batch["input_ids"]
        gen.batch["responses"] = torch.full((rows, R), 9)
        gen.batch["response_mask"] = response_mask
        gen.batch["input_ids"] = torch.cat([gen.batch["input_ids"], gen.batch["responses"]], 1)
        gen.batch["attention_mask"] = torch.cat([gen.batch["attention_mask"], response_mask], 1)
        last = gen.batch["position_ids"][:, -1:]
        gen.batch["position_ids"] = torch.cat(
            [gen.batch["position_ids"], last + torch.arange(1, R + 1)], 1
        )
        gen.batch["token_level_scores"] = scores
        gen.non_tensor_batch["acc"] = np.array([a for a, _ in scripted], dtype=np.float64)
        gen.non_tensor_batch["score"] = np.array([s for _, s in scripted], dtype=np.float64)
        metrics = {
            "timing_s/gen": 1.0,
            "reward/acc": float(np.mean([a for a, _ in scripted])),
        }
        return gen, metrics


class Loader:
    """The rest of the data loader: hands out queued batches and counts what was drawn."""

    def __init__(self, batches: list[DataProto]) -> None:
        self.batches = list(batches)
        self.drawn = 0

    def __call__(self) -> DataProto:
        self.drawn += 1
        return self.batches.pop(0)


def test_keeps_only_mixed_groups_and_trims_to_batch_size():
    first = prompts(["right", "wrong", "mixed", "mixed"], width=3, first_id=0)
    second = prompts(["mixed", "right", "mixed", "mixed"], width=5, first_id=4)
    loader, generate = Loader([second]), ScriptedGenerate()
    out, metrics = collect_informative_groups(
        first, loader, generate, metric="acc", num_prompts=4, max_num_gen_batches=0
    )
    # 2 informative groups in batch 1, 3 in batch 2: 5 >= 4, the 5th (prompt 7) is trimmed
    assert loader.drawn == 1 and generate.calls == 2
    assert len(out) == 4 * N
    assert out.non_tensor_batch["prompt_id"].tolist() == [2, 2, 3, 3, 4, 4, 6, 6]
    assert set(out.non_tensor_batch["kind"]) == {"mixed"}
    # every kept group has one correct and one wrong response
    assert out.non_tensor_batch["acc"].tolist() == [1.0, 0.0] * 4
    assert metrics == {
        "timing_s/gen": 2.0,  # summed over the two generation batches
        "reward/acc": (0.5 + 0.625) / 2,  # batch means: 4/8 and 5/8 correct
        "dapo/num_gen_batches": 2.0,
        "dapo/prompts_generated": 8.0,
        "dapo/groups_dropped": 3.0,  # right, wrong, right
        "dapo/groups_trimmed": 1.0,
    }


def test_prompts_of_different_widths_are_left_padded_to_the_widest():
    first = prompts(["mixed", "right"], width=2, first_id=0)
    second = prompts(["mixed", "mixed"], width=4, first_id=2)
    out, _ = collect_informative_groups(
        first,
        Loader([second]),
        ScriptedGenerate(),
        metric="acc",
        num_prompts=2,
        max_num_gen_batches=0,
        pad_token_id=PAD,
    )
    assert out.batch["prompts"].shape == (4, 4)
    assert out.batch["input_ids"].shape == (4, 4 + R)
    # prompt 0 (1 real token, was width 2) now has 3 pad columns on the left
    assert out.batch["attention_mask"][0].tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert out.batch["input_ids"][0].tolist() == [PAD, PAD, PAD, 7, 9, 9, 9]
    assert out.batch["position_ids"][0].tolist() == [0, 0, 0, 0, 1, 2, 3]
    # rows from the wider batch are unchanged: prompt 2 has 1 real token of 4
    assert out.batch["attention_mask"][2].tolist() == [0, 0, 0, 1, 1, 1, 1]


def test_metric_choice_decides_what_is_identical():
    batch = prompts(["penalised", "mixed"], width=2, first_id=0)
    out, _ = collect_informative_groups(
        batch,
        Loader([]),
        ScriptedGenerate(),
        metric="seq_reward",
        num_prompts=2,
        max_num_gen_batches=1,
    )
    assert out.non_tensor_batch["prompt_id"].tolist() == [0, 0, 1, 1]
    with pytest.raises(RuntimeError, match=r"1 of data\.train_batch_size=2 informative"):
        collect_informative_groups(
            prompts(["penalised", "mixed"], width=2, first_id=0),
            Loader([]),
            ScriptedGenerate(),
            metric="acc",  # equal acc: the penalised group is dropped
            num_prompts=2,
            max_num_gen_batches=1,
        )


def test_max_num_gen_batches_bounds_the_loop_with_counts():
    batches = [prompts(["right", "wrong"], width=2, first_id=2 * i) for i in range(3)]
    loader = Loader(batches[1:])
    with pytest.raises(RuntimeError) as info:
        collect_informative_groups(
            batches[0],
            loader,
            ScriptedGenerate(),
            metric="score",
            num_prompts=2,
            max_num_gen_batches=2,
        )
    assert str(info.value).startswith(
        "dynamic sampling: 0 of data.train_batch_size=2 informative prompts after 2 "
        "generation batches (4 prompts, 4 groups with identical score), "
        "algorithm.filter_groups.max_num_gen_batches=2;"
    )
    assert loader.drawn == 1  # two batches consumed in all, the third never drawn


def test_missing_metric_is_an_error_naming_the_key():
    gen, _ = ScriptedGenerate()(prompts(["mixed"], width=1, first_id=0))
    gen.non_tensor_batch["acc"] = np.array([1.0, np.nan], dtype=object)
    with pytest.raises(
        ValueError, match=r"metric=acc: the reward function reported no acc for 1 of 2"
    ):
        filter_metric_values(gen, "acc")
    torch.testing.assert_close(
        filter_metric_values(gen, "seq_reward"), torch.tensor([1.0, 0.0], dtype=torch.float64)
    )


def test_merge_step_metrics():
    merged = merge_step_metrics(
        [
            {"timing_s/gen": 1.5, "reward/score_max": 1.0, "reward/score_min": 0.0, "x": 1.0},
            {"timing_s/gen": 2.0, "reward/score_max": 3.0, "reward/score_min": -1.0, "x": 2.0},
        ]
    )
    assert merged == {
        "timing_s/gen": 3.5,
        "reward/score_max": 3.0,
        "reward/score_min": -1.0,
        "x": 1.5,
    }


# ---------------------------------------------------------------------- through the trainer


def scripted_reward(batch: DataProto):
    """Prompt ``index % 3``: 0 -> both responses right, 1 -> both wrong, 2 -> one of each."""
    uids = batch.non_tensor_batch["uid"].tolist()
    seen: dict[str, int] = {}
    acc = []
    for uid, index in zip(uids, batch.non_tensor_batch["index"].tolist()):
        position = seen.setdefault(uid, 0)
        seen[uid] += 1
        acc.append([1.0, 0.0, float(position == 0)][index % 3])
    acc_t = torch.tensor(acc)
    scores = place_on_last_token(acc_t, batch.batch["response_mask"])
    extras = {"acc": np.array(acc), "score": np.array(acc)}
    return scores, {"reward/acc": acc_t.mean().item()}, extras


def test_trainer_updates_only_on_mixed_groups(tmp_path):
    model_dir = save_tiny_model_dir(tmp_path / "model", arch="qwen2")
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={model_dir}",
            "data.train_batch_size=4",
            "data.max_response_length=4",
            "data.shuffle=false",
            "data.arithmetic.train_size=16",
            "data.arithmetic.val_size=2",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=4",
            "algorithm.filter_groups.enable=true",
            "algorithm.filter_groups.metric=acc",
            "algorithm.filter_groups.max_num_gen_batches=5",
            "trainer.total_training_steps=2",
            "trainer.val_before_train=false",
            "trainer.logger=[]",
            f"trainer.default_local_dir={tmp_path}",
            f"trainer.log_dir={tmp_path}",
        ]
    )
    trainer = RLTrainer(cfg, reward_fn=scripted_reward)
    updated: list[DataProto] = []
    update_policy = trainer.update_policy

    def recording_update(gen: DataProto):
        updated.append(gen)
        return update_policy(gen)

    trainer.update_policy = recording_update
    trainer.fit()

    # Unshuffled prompts 0..15 in batches of 4; mixed prompts are 2, 5, 8, 11, 14.
    # Step 1 draws [0-3] [4-7] [8-11] -> 2, 5, 8, 11. Step 2 draws [12-15], then the next
    # epoch's [0-3] [4-7] [8-11] -> 14, 2, 5, 8 (11 is the 5th informative group: trimmed).
    kept = [gen.non_tensor_batch["index"].tolist() for gen in updated]
    assert kept == [[2, 2, 5, 5, 8, 8, 11, 11], [14, 14, 2, 2, 5, 5, 8, 8]]
    for gen in updated:
        assert len(gen) == 4 * 2
        assert gen.non_tensor_batch["acc"].tolist() == [1.0, 0.0] * 4
        assert len(set(gen.non_tensor_batch["uid"].tolist())) == 4
        # one right and one wrong response per group: GRPO advantages +-1/(std + eps)
        adv = gen.batch["advantages"].sum(-1) / gen.batch["response_mask"].sum(-1)
        torch.testing.assert_close(adv, torch.tensor([0.7071, -0.7071] * 4), atol=1e-3, rtol=0)
    first, second = trainer.history
    assert (first["dapo/num_gen_batches"], first["dapo/prompts_generated"]) == (3.0, 12.0)
    assert (first["dapo/groups_dropped"], first["dapo/groups_trimmed"]) == (8.0, 0.0)
    assert (second["dapo/num_gen_batches"], second["dapo/prompts_generated"]) == (4.0, 16.0)
    assert (second["dapo/groups_dropped"], second["dapo/groups_trimmed"]) == (11.0, 1.0)
    # the 7 batches drawn count as consumed: 4 per epoch, so epoch 1, position 3
    state = trainer.train_loader.state_dict()["sampler"]
    assert (state["epoch"], state["position"]) == (1, 3)
    assert second["training/epoch"] == 1

"""Group-aware micro-batches and mini-batch shuffles for shared-prompt packing: a group's
rows stay together where they fit, token budgets count each group's prompt once, and the
loss weights (hence gradients) do not depend on the split."""

from __future__ import annotations

import torch

from verl.protocol import DataProto
from verl.workers.common import iter_ppo_mini_batches, micro_batch_weights
from verl.workers.micro_batching import split_micro_batches

P, R = 6, 4
PROMPT_LENS = [6, 3, 5, 2, 4]
# (prompt, response length): groups of 4, 3, 2, 1 and 2 rows, interleaved
ROWS = [(0, 4), (1, 2), (0, 3), (2, 4), (1, 0), (0, 1), (3, 4), (2, 2), (1, 4), (0, 4)]
ROWS += [(4, 3), (4, 1)]


def _data() -> DataProto:
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 99, (p,), generator=gen) for p in PROMPT_LENS]
    ids = torch.zeros(len(ROWS), P + R, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (g, r) in enumerate(ROWS):
        ids[i, P - PROMPT_LENS[g] : P] = prompts[g]
        ids[i, P : P + r] = torch.randint(3, 99, (r,), generator=gen)
        mask[i, P - PROMPT_LENS[g] : P + r] = 1
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp_min(0),
            "response_mask": mask[:, P:].float(),
            "row": torch.arange(len(ROWS)),
        }
    )


def _groups_of(index: torch.Tensor) -> list[int]:
    return [ROWS[int(i)][0] for i in index]


def test_fixed_size_micro_batches_keep_groups_whole():
    data = _data()
    micro = split_micro_batches(data, R, micro_batch_size=4, packed=True, share_prefix=True)
    assert sorted(int(i) for mb in micro for i in mb.index) == list(range(len(ROWS)))
    assert all(len(mb.index) <= 4 for mb in micro)
    where = {}
    for k, mb in enumerate(micro):
        for g in _groups_of(mb.index):
            where.setdefault(g, set()).add(k)
    assert all(len(v) == 1 for v in where.values())  # every group (<= 4 rows) in one
    # a group larger than the micro-batch is cut into full micro-batches
    micro = split_micro_batches(data, R, micro_batch_size=2, packed=True, share_prefix=True)
    assert [len(mb.index) for mb in micro if set(_groups_of(mb.index)) == {0}] == [2, 2]
    # the rows are the batch's own (trimmed), so outputs gather back by index
    for mb in micro:
        assert torch.equal(mb.data.batch["row"], mb.index)


def test_token_budget_counts_each_prompt_once():
    data = _data()
    budget = 16
    micro = split_micro_batches(data, R, max_token_len=budget, packed=True, share_prefix=True)
    assert sorted(int(i) for mb in micro for i in mb.index) == list(range(len(ROWS)))
    for mb in micro:
        shared = sum(PROMPT_LENS[g] for g in set(_groups_of(mb.index)))
        shared += sum(ROWS[int(i)][1] for i in mb.index)
        assert shared <= budget or len(mb.index) == 1
    plain = split_micro_batches(data, R, max_token_len=budget, packed=True)
    assert len(micro) < len(plain)  # the prompts no longer count n times
    # ranks agree on a count: this rank splits its micro-batches to match
    more = split_micro_batches(
        data, R, max_token_len=budget, packed=True, share_prefix=True, agree=lambda n: n + 2
    )
    assert len(more) == len(micro) + 2


def test_loss_weights_do_not_depend_on_the_split():
    data = _data()
    for mode in ("token-mean", "seq-mean-token-mean"):
        for split in (
            split_micro_batches(data, R, micro_batch_size=3, packed=True, share_prefix=True),
            split_micro_batches(data, R, max_token_len=12, packed=True, share_prefix=True),
        ):
            weights = micro_batch_weights([mb.data for mb in split], mode)
            assert abs(sum(weights) - 1.0) < 1e-12


def test_grouped_shuffle_keeps_groups_adjacent_and_covers_every_row():
    data = _data()
    minis = list(iter_ppo_mini_batches(data, 6, epochs=2, shuffle=True, seed=3, by_group=True))
    for epoch in (minis[:2], minis[2:]):
        order = torch.cat([m.batch["row"] for m in epoch]).tolist()
        assert sorted(order) == list(range(len(ROWS)))
        groups = [ROWS[i][0] for i in order]
        runs = [g for k, g in enumerate(groups) if k == 0 or groups[k - 1] != g]
        assert len(runs) == len(PROMPT_LENS)  # each group one contiguous run
    first = torch.cat([m.batch["row"] for m in minis[:2]]).tolist()
    second = torch.cat([m.batch["row"] for m in minis[2:]]).tolist()
    assert first != second  # reshuffled per epoch

"""The code of the user guides runs as written: the reward functions of docs/custom_reward.md,
the rows of docs/data.md, and every docs page is linked from the README."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from verl.rewards import load_reward_function

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _python_block(page: Path, first_line: str) -> str:
    """The ```python block of ``page`` whose first line is ``first_line``."""
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    found = [b for b in blocks if b.splitlines()[0].strip() == first_line]
    assert len(found) == 1, f"{page.name}: {len(found)} python blocks start with {first_line!r}"
    return found[0]


def _load(page: str, filename: str, tmp_path: Path):
    path = tmp_path / filename
    path.write_text(_python_block(DOCS / page, f"# {filename}"))
    return load_reward_function(str(path), "compute_score")


def test_custom_reward_doc_function_scores_as_described(tmp_path):
    fn = _load("custom_reward.md", "my_reward.py", tmp_path)
    kw = {"data_source": "custom", "ground_truth": "12"}
    assert fn(solution_str="3 * 4 = 12", extra_info={}, **kw) == {"score": 1.0, "acc": 1.0}
    assert fn(solution_str="It is 1,200 or 13", extra_info=None, **kw) == {
        "score": 0.0,
        "acc": 0.0,
    }
    assert fn(solution_str="no number", extra_info={}, **kw) == {"score": 0.0, "acc": 0.0}
    long = "well " * 10 + "12"
    out = fn(solution_str=long, extra_info={"max_words": 5}, **kw)
    assert out["acc"] == 1.0 and out["score"] == pytest.approx(0.9)


def test_custom_reward_doc_function_passes_the_managers_signature_check(tmp_path):
    from verl.rewards import RewardManager

    fn = _load("custom_reward.md", "my_reward.py", tmp_path)
    # the check that refuses a function the four keywords cannot be passed to
    with pytest.raises(TypeError, match="cannot be called as fn"):
        RewardManager(None, compute_score=lambda solution, truth: 0.0, isolation="inline")
    RewardManager(None, compute_score=fn, isolation="inline")


def test_custom_reward_doc_code_reward_runs_cases_in_the_sandbox(tmp_path):
    fn = _load("custom_reward.md", "code_reward.py", tmp_path)
    truth = json.dumps({"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12\n"]})
    right = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    half = "```python\na, b = map(int, input().split())\nprint(3)\n```"
    crash = "```python\nraise SystemExit(1)\n```"
    kw = {"data_source": "code", "ground_truth": truth, "extra_info": {}}
    assert fn(solution_str=right, **kw) == {"score": 1.0, "acc": 1.0}
    assert fn(solution_str=half, **kw) == {"score": 0.5, "acc": 0.0}
    assert fn(solution_str=crash, **kw) == {"score": 0.0, "acc": 0.0}


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[^)#]+)", readme))
    pages = {f"docs/{p.name}" for p in DOCS.glob("*.md")}
    assert pages - linked == set(), f"not linked from README.md: {sorted(pages - linked)}"
    for target in linked:
        assert (ROOT / target).exists(), f"README links to a missing {target}"


def test_data_doc_rows_load_and_score(tmp_path):
    from transformers import AutoTokenizer

    from verl.data.rl_dataset import RLHFDataset
    from verl.models.tiny import save_tiny_model_dir
    from verl.rewards.scorers import default_compute_score

    text = (DOCS / "data.md").read_text()
    block = re.search(r"```jsonl\n(.*?)```", text, flags=re.S).group(1)
    rows = [json.loads(line) for line in block.splitlines() if line.strip()]
    path = tmp_path / "prompts.jsonl"
    path.write_text(block)
    tokenizer = AutoTokenizer.from_pretrained(save_tiny_model_dir(tmp_path / "model"))
    dataset = RLHFDataset(str(path), tokenizer, max_prompt_length=256)
    assert len(dataset) == 3
    # a string prompt is one user message
    assert dataset[2]["raw_prompt"] == [{"role": "user", "content": rows[2]["prompt"]}]
    assert dataset[0]["extra_info"] == {"split": "train", "index": 0}
    # the built-in scorers of the first two rows
    for row, right, wrong in ((rows[0], "7", "8"), (rows[1], "3 + 2 = 5\n#### 5", "#### 6")):
        source, truth = row["data_source"], row["reward_model"]["ground_truth"]
        assert default_compute_score(source, right, truth)["score"] == 1.0
        assert default_compute_score(source, wrong, truth)["score"] == 0.0


USER_GUIDES = (
    "concepts.md",
    "quickstart_cpu.md",
    "quickstart_gpu.md",
    "custom_reward.md",
    "data.md",
)
SECTIONS = (
    "data",
    "actor_rollout_ref",
    "critic",
    "reward_model",
    "custom_reward_function",
    "algorithm",
    "trainer",
    "resource_pool",
)


@pytest.mark.parametrize("page", USER_GUIDES)
def test_user_guide_config_keys_exist(page):
    """Every full config key a guide names (`section.key...`, with or without `=value`) is
    a key of the PPO config (or of the SFT / DPO config, for data.md's SFT section); the
    other dotted names are data columns and worker-group methods."""
    from verl.config import TrainerConfig, load_dpo_config, load_sft_config
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
    from verl.workers.critic import CriticWorker

    columns = {"reward_model.ground_truth", "reward_model.style"}
    configs = (TrainerConfig(), load_sft_config(), load_dpo_config())

    def resolves(config, key: str) -> bool:
        node = config
        for part in key.split("."):
            if not hasattr(node, part):
                return False
            node = getattr(node, part)
        return True

    text = (DOCS / page).read_text()
    sections = "|".join(SECTIONS)
    pattern = rf"(?<![\w./])((?:{sections})(?:\.[A-Za-z_][\w]*)+)(?==|`|\s|$)"
    keys = set(re.findall(pattern, text))
    assert keys, f"{page} names no config key"
    for key in sorted(keys - columns):
        group, _, method = key.partition(".")
        worker = {"actor_rollout_ref": ActorRolloutRefWorker, "critic": CriticWorker}.get(group)
        if worker is not None and callable(getattr(worker, method, None)):
            continue
        assert any(resolves(c, key) for c in configs), f"{page}: {key} is not a config key"

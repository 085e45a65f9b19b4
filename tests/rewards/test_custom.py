"""Loading a custom reward function from a file, and its errors."""

from __future__ import annotations

import pickle

import pytest

from verl.rewards.custom import load_reward_function

GOOD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(solution_str == ground_truth), "acc": 1.0, "src": data_source}

def other(data_source, solution_str, ground_truth, extra_info=None):
    return 0.25

not_a_function = 3
"""


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(GOOD)
    return path


def test_load_and_call_with_keywords(reward_file):
    fn = load_reward_function(str(reward_file))
    out = fn(data_source="ds", solution_str="a", ground_truth="a", extra_info=None)
    assert out == {"score": 1.0, "acc": 1.0, "src": "ds"}
    assert fn.__name__ == "compute_score"
    other = load_reward_function(str(reward_file), name="other")
    assert other(data_source="", solution_str="", ground_truth="", extra_info={}) == 0.25


def test_loaded_function_pickles_by_path(reward_file):
    fn = pickle.loads(pickle.dumps(load_reward_function(str(reward_file), "other")))
    assert fn(data_source="", solution_str="", ground_truth="", extra_info=None) == 0.25
    assert fn.path == str(reward_file)


def test_two_files_with_the_same_name_do_not_clash(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "reward.py").write_text("def compute_score(**kw):\n    return 1.0\n")
    (tmp_path / "b" / "reward.py").write_text("def compute_score(**kw):\n    return 2.0\n")
    fa = load_reward_function(str(tmp_path / "a" / "reward.py"))
    fb = load_reward_function(str(tmp_path / "b" / "reward.py"))
    assert (fa(), fb()) == (1.0, 2.0)


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.py"
    with pytest.raises(FileNotFoundError, match=r"nope\.py"):
        load_reward_function(str(missing))
    with pytest.raises(FileNotFoundError, match="not found"):
        load_reward_function(str(tmp_path))  # a directory is not a file


def test_missing_function_names_path_and_alternatives(reward_file):
    with pytest.raises(AttributeError, match="defines no 'score_fn'") as info:
        load_reward_function(str(reward_file), name="score_fn")
    assert str(reward_file) in str(info.value)
    assert "compute_score" in str(info.value) and "other" in str(info.value)


def test_not_callable(reward_file):
    with pytest.raises(TypeError, match=r"'not_a_function' .* is a int, not a callable") as info:
        load_reward_function(str(reward_file), name="not_a_function")
    assert str(reward_file) in str(info.value)


def test_import_error_is_wrapped_with_path(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import definitely_not_a_module_xyz\n")
    with pytest.raises(ImportError, match=r"broken\.py.*ModuleNotFoundError") as info:
        load_reward_function(str(broken))
    assert isinstance(info.value.__cause__, ModuleNotFoundError)

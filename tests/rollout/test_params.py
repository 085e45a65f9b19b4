"""SamplingParams validation and the derived greedy / log-prob temperature."""

import pytest

from verl.rollout import SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n": 0}, "n=0"),
        ({"temperature": -0.1}, "temperature=-0.1"),
        ({"top_p": 0.0}, "top_p=0.0"),
        ({"top_p": 1.5}, "top_p=1.5"),
        ({"top_k": 0}, "top_k=0"),
        ({"top_k": -2}, "top_k=-2"),
        ({"max_new_tokens": 0}, "max_new_tokens=0"),
        ({"stop_token_ids": [1, -3]}, "stop_token_ids"),
        ({"stop_strings": "###"}, "list of strings"),
        ({"stop_strings": [""]}, "non-empty"),
        ({"seed": 1.5}, "seed=1.5"),
    ],
)
def test_invalid_params_name_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_greedy_and_logprob_temperature():
    assert SamplingParams(temperature=0).greedy
    assert SamplingParams(temperature=0).logprob_temperature == 1.0
    assert SamplingParams(do_sample=False, temperature=0.7).greedy
    assert SamplingParams(do_sample=False, temperature=0.7).logprob_temperature == 0.7
    p = SamplingParams(temperature=0.5, top_k=5, stop_token_ids=(3, 4))
    assert not p.greedy and p.logprob_temperature == 0.5
    assert p.stop_token_ids == [3, 4]
    assert SamplingParams().stop_token_ids is None  # resolved to eos by the engine

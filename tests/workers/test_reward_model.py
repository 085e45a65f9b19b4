"""Tests for verl/workers/reward_model.py: RM scoring of actor ids and of re-tokenized text."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForSequenceClassification

from verl.config import TrainerConfig
from verl.controller import LocalWorkerGroup, ResourcePool
from verl.models import build_tiny_tokenizer
from verl.protocol import DataProto
from verl.workers.reward_model import RewardModelWorker, vocab_fingerprint
from verl.workers.specs import reward_model_spec

PROMPTS = [
    [{"role": "user", "content": "What is 2 + 3?"}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 12 * 4? Show your work."},
    ],
    "hello world",
    [{"role": "user", "content": "Give me one number."}],
]
# (text, ends with eos): row 2 is a zero-length response, row 3 was truncated (no eos).
RESPONSES = [("The answer is 5.", True), ("48", True), ("", False), ("Let us think 12 * 4", False)]
RESPONSE_LEN = 12
EXTRA_VOCAB = 8  # room for tokens added to an RM tokenizer


def _messages(prompt):
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt


def _save_rm(path, tok, num_labels=1, seed=0):
    config = Qwen2Config(
        vocab_size=len(tok) + EXTRA_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        num_labels=num_labels,
        pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForSequenceClassification(config)
        # Spread the scores out so that a wrong token position shows as a large difference.
        torch.nn.init.normal_(model.score.weight, std=0.5)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model.eval()


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def rm_setup(tmp_path_factory, tok):
    path = tmp_path_factory.mktemp("rm")
    return path, _save_rm(path, tok)


@pytest.fixture(scope="module")
def rows(tok):
    """Unpadded (prompt ids, response ids) per row."""
    out = []
    for prompt, (text, eos) in zip(PROMPTS, RESPONSES):
        rendered = tok.apply_chat_template(
            _messages(prompt), add_generation_prompt=True, tokenize=False
        )
        p = tok(rendered, add_special_tokens=False)["input_ids"]
        r = tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])
        out.append((p, r))
    return out


@pytest.fixture(scope="module")
def data(tok, rows):
    """Left-padded prompts + right-padded responses, as after generation."""
    pad = tok.pad_token_id
    plen = max(len(p) for p, _ in rows)
    prompts = torch.full((len(rows), plen), pad)
    responses = torch.full((len(rows), RESPONSE_LEN), pad)
    pmask = torch.zeros_like(prompts)
    rmask = torch.zeros_like(responses)
    for i, (p, r) in enumerate(rows):
        prompts[i, plen - len(p) :] = torch.tensor(p)
        pmask[i, plen - len(p) :] = 1
        responses[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        rmask[i, : len(r)] = 1
    attention_mask = torch.cat([pmask, rmask], 1)
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "response_mask": rmask,
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        },
        non_tensors={"raw_prompt": PROMPTS},
    )


def _config(path, mbs=2):
    cfg = TrainerConfig(mixed_precision="none")  # fp32 scores on any CPU
    cfg.trainer.device = "cpu"
    cfg.reward_model.enable = True
    cfg.reward_model.model.path = str(path)
    cfg.reward_model.micro_batch_size_per_device = mbs
    return cfg


def _score_alone(model, ids):
    """HF's own forward on one unpadded sequence: the reference score."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, 0].item()


def _worker(path, tok, mbs=2, **kwargs):
    worker = RewardModelWorker(reward_model_spec(_config(path, mbs)), actor_tokenizer=tok, **kwargs)
    worker.init_model()
    return worker


def _check_placement(rm_scores, rows, expected):
    assert rm_scores.dtype == torch.float32 and rm_scores.shape == (len(rows), RESPONSE_LEN)
    for i, (_, r) in enumerate(rows):
        last = max(len(r) - 1, 0)  # an empty response gets its score at position 0
        want = torch.zeros(RESPONSE_LEN)
        want[last] = expected[i]
        torch.testing.assert_close(rm_scores[i], want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("mbs", [1, 3])
def test_same_vocab_scores_actor_ids_like_unpadded(rm_setup, tok, rows, data, mbs):
    path, model = rm_setup
    worker = _worker(path, tok, mbs=mbs)
    assert worker.retokenize is False  # the RM dir holds the actor's tokenizer
    out = worker.compute_rm_score(data)
    expected = [_score_alone(model, p + r) for p, r in rows]
    assert len(set(round(x, 3) for x in expected)) == len(rows)  # distinct: positions matter
    _check_placement(out.batch["rm_scores"], rows, expected)


def test_eos_equal_to_pad_is_still_scored(tmp_path, rows, data):
    """HF's pooling skips a final token equal to pad_token_id; ours reads the mask."""
    tok = build_tiny_tokenizer()
    tok.pad_token = tok.eos_token  # pad == eos, as for many chat models
    model = _save_rm(tmp_path, tok)
    out = _worker(tmp_path, tok).compute_rm_score(data)
    with torch.no_grad():
        expected = [
            model.score(model.model(torch.tensor([p + r])).last_hidden_state[0, -1]).item()
            for p, r in rows
        ]
    _check_placement(out.batch["rm_scores"], rows, expected)


def _by_hand(model, rm_tok):
    scores = []
    for prompt, (text, _) in zip(PROMPTS, RESPONSES):
        chat = [*_messages(prompt), {"role": "assistant", "content": text}]
        rendered = rm_tok.apply_chat_template(chat, tokenize=False)
        scores.append(_score_alone(model, rm_tok(rendered, add_special_tokens=False)["input_ids"]))
    return scores


def test_forced_retokenize_matches_hand_encoding(rm_setup, tok, rows, data):
    path, model = rm_setup
    worker = _worker(path, tok, retokenize=True)
    out = worker.compute_rm_score(data)
    _check_placement(out.batch["rm_scores"], rows, _by_hand(model, tok))


def test_different_vocab_retokenizes_with_rm_template(rm_setup, tok, rows, data):
    path, model = rm_setup
    rm_tok = build_tiny_tokenizer()
    rm_tok.add_tokens(["<rm_only>"])
    rm_tok.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    )
    assert vocab_fingerprint(rm_tok) != vocab_fingerprint(tok)
    worker = _worker(path, tok, tokenizer=rm_tok)
    assert worker.retokenize is True
    out = worker.compute_rm_score(data)
    expected = _by_hand(model, rm_tok)
    # The RM template really changed the inputs: these differ from scoring the actor's ids.
    assert all(abs(a - _score_alone(model, p + r)) > 1e-3 for a, (p, r) in zip(expected, rows))
    _check_placement(out.batch["rm_scores"], rows, expected)


def test_retokenize_needs_raw_prompt(rm_setup, tok, data):
    path, _ = rm_setup
    worker = _worker(path, tok, retokenize=True)
    with pytest.raises(KeyError, match="raw_prompt"):
        worker.compute_rm_score(data.select(non_tensor_keys=[]))


def test_worker_group_splits_and_pads(rm_setup, tok, rows, data):
    path, model = rm_setup
    wg = LocalWorkerGroup(
        RewardModelWorker,
        ResourcePool([2]),
        spec=reward_model_spec(_config(path)),
        actor_tokenizer=tok,
    )
    wg.init_model()
    out = wg.compute_rm_score(data[:3])  # 3 rows over 2 ranks: padded, then unpadded
    expected = [_score_alone(model, p + r) for p, r in rows[:3]]
    _check_placement(out.batch["rm_scores"], rows[:3], expected)


def test_num_labels_must_be_one(tmp_path, tok):
    _save_rm(tmp_path, tok, num_labels=2)
    with pytest.raises(ValueError, match=r"num_labels=2") as err:
        _worker(tmp_path, tok)
    assert str(tmp_path) in str(err.value)

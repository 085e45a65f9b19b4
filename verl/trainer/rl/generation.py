"""Offline rollouts: a model's ``n`` responses to every prompt of a dataset, with their
log-probs and scores, as one row per prompt (``verl generate``, ``verl eval``).

Nothing here samples or scores by itself: the prompts are read and tokenized by
:class:`~verl.data.RLHFDataset` and collated as in training, the responses come from the
configured rollout backend (``actor_rollout_ref.rollout.name``: ``native``, ``hf``, ...)
with the sampling parameters the actor worker would use, and the scores from the
validation reward manager (the built-in scorers or ``custom_reward_function``). The
settings are a :class:`~verl.config.TrainerConfig`, so every key means what it means in
training: ``actor_rollout_ref.model.path``, ``rollout.n`` / ``temperature`` / ``top_p`` /
``top_k`` / ``do_sample`` / ``stop`` / ``seed``, ``data.max_prompt_length``,
``data.max_response_length``, ``data.prompt_key``, ``data.truncation``.

A row (one prompt): ``data_source``, ``prompt`` (the dataset's messages, so the file is
still a prompt dataset), ``prompt_text`` (after the chat template), ``ground_truth``,
``extra_info`` and ``index`` when the dataset has them, ``prompt_token_ids`` (the prompt's
token ids, unpadded) and ``temperature`` (of the log-probs), and per response (lists of
length ``n``): ``responses`` (text), ``response_lengths`` (tokens, the stop token
included), ``response_token_ids`` (the sampled ids, one list per response),
``response_log_probs`` (the sum of the sampled tokens' log-probs),
``response_token_log_probs`` (one list per response), ``scores`` and ``accs`` (the
scorer's accuracy; its score when it reports none). The token ids and log-probs make the
file a training batch as well (``data.rollout_files``, :mod:`verl.data.rollout_file`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from verl.config import TrainerConfig
from verl.data import RLHFDataset, collate_fn
from verl.models.loading import load_causal_lm
from verl.models.precision import resolve_dtype
from verl.protocol import DataProto
from verl.rollout import SamplingParams, build_rollout
from verl.trainer.rl.build import build_reward_manager, build_tokenizer, load_compute_score
from verl.trainer.rl.samples import decode_prompts_and_responses
from verl.utils.device import resolve_device

logger = logging.getLogger(__name__)

# dataset fields copied from the first sample of each prompt into its row
_CARRIED = ("ground_truth", "extra_info", "index")


def sampling_params(cfg: TrainerConfig, tokenizer: Any, seed: int | None) -> SamplingParams:
    """The rollout section as :class:`SamplingParams` (EOS stops; ``stop`` strings too)."""
    rcfg = cfg.actor_rollout_ref.rollout
    eos = tokenizer.eos_token_id
    return SamplingParams(
        n=rcfg.n,
        temperature=rcfg.temperature,
        top_p=rcfg.top_p,
        top_k=rcfg.top_k,
        do_sample=rcfg.do_sample,
        max_new_tokens=cfg.data.max_response_length,
        stop_token_ids=[eos] if eos is not None else [],
        stop_strings=list(rcfg.stop),
        seed=seed,
    )


def load_prompts(cfg: TrainerConfig, files: Sequence[str], tokenizer: Any) -> RLHFDataset:
    """The prompt dataset of ``files``, read as training reads ``data.val_files``."""
    d = cfg.data
    return RLHFDataset(
        list(files),
        tokenizer=tokenizer,
        max_prompt_length=d.max_prompt_length,
        truncation=d.truncation,
        apply_chat_template=d.apply_chat_template,
        prompt_key=d.prompt_key,
    )


def generate_rows(
    cfg: TrainerConfig,
    files: Sequence[str],
    batch_size: int = 16,
    limit: int | None = None,
    show_progress: bool = True,
) -> list[dict[str, Any]]:
    """Sample ``rollout.n`` responses for each prompt of ``files`` (the first ``limit``
    prompts when given) with the model of ``actor_rollout_ref.model.path``, score them,
    and return one row per prompt (see the module docstring)."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    arr = cfg.actor_rollout_ref
    tokenizer = build_tokenizer(cfg)
    dataset = load_prompts(cfg, files, tokenizer)
    count = len(dataset) if limit is None else min(limit, len(dataset))
    device = resolve_device(cfg.trainer.device)
    model = load_causal_lm(
        arr.model.path,
        dtype=resolve_dtype(arr.model.dtype),
        trust_remote_code=arr.model.trust_remote_code,
        override_config=arr.model.override_config,
    ).to(device)
    rollout = build_rollout(arr.rollout.name, model, tokenizer)
    reward_fn = build_reward_manager(cfg, tokenizer, load_compute_score(cfg), train=False)
    base_seed = arr.rollout.seed if arr.rollout.seed is not None else cfg.trainer.seed
    rows: list[dict[str, Any]] = []
    try:
        starts = range(0, count, batch_size)
        for i, start in enumerate(tqdm(starts, desc="generating", disable=not show_progress)):
            items = [dataset[j] for j in range(start, min(start + batch_size, count))]
            prompts = collate_fn(items, pad_token_id=tokenizer.pad_token_id)
            params = sampling_params(cfg, tokenizer, seed=base_seed + i)
            with torch.no_grad():
                gen = rollout.generate(prompts.to(device), params).to("cpu")
            _, _, extras = reward_fn(gen)
            rows += _rows(gen, extras, tokenizer, params.n, params.logprob_temperature)
    finally:
        close = getattr(reward_fn, "close", None)
        if close is not None:
            close()
    return rows


def _rows(
    gen: DataProto, extras: dict[str, Any], tokenizer: Any, n: int, temperature: float
) -> list[dict[str, Any]]:
    """Group the ``B * n`` rollout rows (``repeat_interleave`` order) by prompt."""
    prompt_texts, responses = decode_prompts_and_responses(gen, tokenizer)
    mask = gen.batch["response_mask"].bool()
    prompts = gen.batch["prompts"]
    prompt_mask = gen.batch["attention_mask"][:, : prompts.shape[1]].bool()
    response_ids = gen.batch["responses"]
    token_log_probs = gen.batch["rollout_log_probs"].float()
    scores = [float(s) for s in extras["score"]]
    accs = [float(a) for a in extras.get("acc", scores)]
    accs = [s if math.isnan(a) else a for a, s in zip(accs, scores)]
    nt = gen.non_tensor_batch
    out = []
    for p in range(len(gen) // n):
        idx = range(p * n, p * n + n)
        row: dict[str, Any] = {
            "data_source": str(nt["data_source"][p * n]),
            "prompt": _plain(nt["raw_prompt"][p * n]),
            "prompt_text": prompt_texts[p * n],
        }
        row |= {key: _plain(nt[key][p * n]) for key in _CARRIED if key in nt}
        row["prompt_token_ids"] = prompts[p * n][prompt_mask[p * n]].tolist()
        row["temperature"] = float(temperature)
        row["responses"] = [responses[i] for i in idx]
        row["response_lengths"] = [int(mask[i].sum()) for i in idx]
        row["response_token_ids"] = [response_ids[i][mask[i]].tolist() for i in idx]
        row["response_token_log_probs"] = [token_log_probs[i][mask[i]].tolist() for i in idx]
        row["response_log_probs"] = [float(token_log_probs[i][mask[i]].sum()) for i in idx]
        row["scores"] = [scores[i] for i in idx]
        row["accs"] = [accs[i] for i in idx]
        out.append(row)
    return out


def _plain(value: Any) -> Any:
    """numpy containers and scalars as Python ones (parquet / JSON writable)."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value

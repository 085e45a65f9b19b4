"""The reward sources of an RL run beyond the rules, built from ``reward_model.*``: the LLM
judge (``judge``), a scoring service (``remote``), their weighted ``mixture`` with the rules
and the reward model, and scoring overlapped with generation (``overlap``). The sources
themselves live in :mod:`verl.rewards` (``judge``, ``remote``, ``mixture``, ``overlap``);
this module adds the one backend that needs the rollout engine, :class:`LocalJudgeBackend`
(a HF causal LM generating greedily through the native engine), and the wiring.

:func:`build_training_reward` returns the training reward in the contract: with no judge,
remote service or mixture configured, the reward model's scores shaped by the rules'
manager when ``reward_model.enable`` (as before), else the rules; otherwise a
:class:`~verl.rewards.sources.SourceReward` over the configured source, shaped by the
rules' manager and bounded by ``reward_model.max_failure_rate``. Validation keeps the
rules (raw scores, comparable across runs), as with a reward model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch

from verl.config import TrainerConfig
from verl.models import load_tokenizer
from verl.models.loading import load_causal_lm
from verl.models.precision import resolve_dtype
from verl.protocol import DataProto
from verl.rewards import ModelScoredReward, RewardFunction
from verl.rewards.http import HttpSettings, bearer_headers
from verl.rewards.judge import HttpJudgeBackend, JudgeParser, JudgeReply, JudgeScorer
from verl.rewards.mixture import MixtureScorer
from verl.rewards.overlap import RewardOverlap
from verl.rewards.remote import RemoteScorer
from verl.rewards.sources import ModelSource, RuleSource, SampleScorer, SourceReward
from verl.rollout import SamplingParams, build_rollout
from verl.utils.device import resolve_device

logger = logging.getLogger(__name__)

__all__ = [
    "LocalJudgeBackend",
    "build_judge",
    "build_overlap",
    "build_training_reward",
    "uses_rules",
]


class LocalJudgeBackend:
    """A HF causal LM as the judge, generating greedily with the native rollout engine.

    Each prompt is rendered with the judge tokenizer's chat template when it has one (one
    user message, generation prompt added), else used as plain text; replies are decoded
    with special tokens skipped. ``complete`` runs one ``generate`` call for its prompts.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        max_new_tokens: int = 64,
        device: torch.device | str = "cpu",
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.engine = build_rollout("native", model, tokenizer)
        eos = tokenizer.eos_token_id
        self.params = SamplingParams(
            n=1,
            temperature=0.0,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            stop_token_ids=[eos] if eos is not None else None,
        )
        self.pad_token_id = self.engine.pad_token_id

    @classmethod
    def from_path(
        cls, path: str, dtype: str = "fp32", device: str = "auto", max_new_tokens: int = 64
    ) -> LocalJudgeBackend:
        """Load the judge model and tokenizer of ``path`` onto ``device``."""
        where = resolve_device(device)
        tokenizer = load_tokenizer(path)
        model = load_causal_lm(path, dtype=resolve_dtype(dtype)).to(where)
        return cls(model, tokenizer, max_new_tokens, where)

    def _encode(self, prompt: str) -> list[int]:
        if getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )
            return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])

    def _batch(self, prompts: Sequence[str]) -> DataProto:
        rows = [self._encode(p) for p in prompts]
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        return DataProto.from_dict(
            tensors={"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids}
        )

    def complete(self, prompts: Sequence[str]) -> tuple[list[JudgeReply], list[float]]:
        start = time.perf_counter()
        with torch.no_grad():
            out = self.engine.generate(self._batch(prompts).to(self.device), self.params)
        responses = out.batch["responses"].cpu()
        mask = out.batch["response_mask"].cpu()
        texts = self.tokenizer.batch_decode(
            [ids[m != 0].tolist() for ids, m in zip(responses, mask)], skip_special_tokens=True
        )
        return [JudgeReply(t) for t in texts], [time.perf_counter() - start]

    def close(self) -> None:
        return None


def _http_settings(section: Any) -> HttpSettings:
    return HttpSettings(
        timeout_s=section.timeout_s,
        max_retries=section.max_retries,
        backoff_s=section.backoff_s,
        max_backoff_s=section.max_backoff_s,
        concurrency=section.concurrency,
        rate_limit=section.rate_limit,
        headers=bearer_headers(section.api_key_env),
    )


def build_judge(cfg: TrainerConfig, tokenizer: Any) -> JudgeScorer:
    """The judge of ``reward_model.judge`` (local model or HTTP endpoint)."""
    j = cfg.reward_model.judge
    if j.backend == "http":
        backend: Any = HttpJudgeBackend(j.base_url, j.model, _http_settings(j), j.max_new_tokens)
    else:
        device = cfg.trainer.device if j.device == "auto" else j.device
        backend = LocalJudgeBackend.from_path(j.model_path, j.dtype, device, j.max_new_tokens)
    parser = JudgeParser(j.parser, j.score_pattern, j.max_score)
    return JudgeScorer(backend, tokenizer, j.prompt_template, parser, j.batch_size)


def _build_remote(cfg: TrainerConfig, tokenizer: Any) -> RemoteScorer:
    r = cfg.reward_model.remote
    return RemoteScorer(r.url, tokenizer, _http_settings(r), r.mode, r.batch_size)


def uses_rules(cfg: TrainerConfig) -> bool:
    """Whether the training reward reads the rule scorers (so the training set's data
    sources must have one)."""
    rm = cfg.reward_model
    if rm.mixture:
        return "rules" in rm.mixture
    return not (rm.enable or rm.judge.enable or rm.remote.url is not None)


def build_training_reward(
    cfg: TrainerConfig, tokenizer: Any, rules: RewardFunction, rm_group: Any = None
) -> RewardFunction:
    """The training reward (module docstring); ``rules`` is the rules' manager (or the
    user's reward function), ``rm_group`` the reward model's worker group, if any."""
    rm = cfg.reward_model
    if not (rm.mixture or rm.judge.enable or rm.remote.url is not None):
        return ModelScoredReward(rm_group, rules) if rm_group is not None else rules
    makers = {
        "rules": lambda: RuleSource(rules),
        "model": lambda: ModelSource(rm_group),
        "judge": lambda: build_judge(cfg, tokenizer),
        "remote": lambda: _build_remote(cfg, tokenizer),
    }
    if rm.mixture:
        scorer: SampleScorer = MixtureScorer(
            {name: (makers[name](), float(w)) for name, w in rm.mixture.items()}
        )
    elif rm.judge.enable:
        scorer = makers["judge"]()
    else:
        scorer = makers["remote"]()
    return SourceReward(scorer, shaper=rules, max_failure_rate=rm.max_failure_rate)


def build_overlap(cfg: TrainerConfig, reward: RewardFunction) -> RewardOverlap | None:
    """The overlap of ``reward_model.overlap`` over ``reward``; None when off (one chunk)."""
    o = cfg.reward_model.overlap
    if o.num_chunks <= 1:
        return None
    return RewardOverlap(reward, o.num_chunks, o.num_workers)

"""Agent programs as rollouts: the user's own agent talks to an OpenAI-compatible endpoint.

An **agent** is a Python callable ``agent(base_url, api_key, task) -> reward | None`` (a
coroutine function is run with ``asyncio.run``) or a command. It gets the endpoint's
``base_url`` (``http://127.0.0.1:<port>/v1``), the API key of its own rollout and the task:
a dict with ``messages`` (the dataset's prompt messages, or None), ``prompt`` (the
dataset's prompt as text, template markup included), ``data_source``, ``ground_truth``,
``extra_info``, ``row`` and ``sample`` (which of the ``n`` samples of the prompt). It talks
to the model with any OpenAI client (``OpenAI(base_url=base_url, api_key=api_key)``) and
returns a reward (a number, or a dict with ``score`` as reward functions do) or None (the
reward function then scores the trajectory). A command gets the task as JSON on its stdin
and ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` in its environment (which the ``openai``
client reads by itself), and prints its reward as JSON on the last line of its stdout
(``1.0``, ``{"score": 1.0}``, ``null``).

:class:`AgentProgramRollout` is a rollout like the agent loop: ``run(prompts, params)``
starts ``params.n`` agents per prompt (at most ``concurrency`` at a time, each limited to
``timeout_s`` seconds), serves their requests from the rollout engine in batches
(:mod:`verl.rollout.openai_server`: every request recorded with its exact prompt ids,
sampled ids and log-probs, turns stitched by prefix without re-tokenizing sampled ids),
and returns the layout of ``verl.rollout.base`` with the agent loop's masks: a row per
agent, its prompt the first prompt of its trajectory, its response everything after it,
``response_mask`` 1 on the model's sampled tokens and 0 on what the agent inserted (tool
results, user turns, template markup), ``rollout_log_probs`` on the model's tokens. The
trajectory of an agent is the chain of requests that ends in its last request; requests
outside that chain (a separate conversation of the same agent) are answered and counted
(``agent_untrained_requests``) but not trained.

**Failures never end the step.** An agent that raises (or a command that exits non-zero or
prints no JSON), one that runs past ``timeout_s`` (its key is closed at once; a command's
process group is killed; a Python agent's thread cannot be killed and is abandoned, as the
agent loop abandons a hung tool), and one that never calls the model each give a row with
no model token, so nothing of it is trained, and are counted (``agent_status``; metrics
``agent/errors``, ``agent/timeouts``, ``agent/no_requests``). A request with an unknown key
(401), after its rollout ended (403), beyond ``max_requests`` (429) or malformed (400) is
refused and counted. An error of the engine itself stops the step (it would fail every
request).

**Rewards.** The row's ``extra_info`` gains ``agent_reward`` (what the agent returned),
``agent_status`` and ``agent_error``. The reward manager ``agent``
(``reward_model.reward_manager=agent``, :class:`AgentRewardManager`) uses the agent's
reward when there is one, scores the others like the default manager (``solution_str``:
the model's own text of the trajectory; ``extra_info["messages"]``: the conversation), and
counts a failed agent as a failed reward call (score 0; too many stop the run, as for any
reward function).

**Parts.** This module drives a step (starts agents, batches and answers their
requests). Loading and running the agents is :mod:`verl.rollout.agent_runs`; trajectories
to rows is :mod:`verl.rollout.agent_trajectory`; the metrics and
:class:`AgentRewardManager` are :mod:`verl.rollout.agent_rewards`; the endpoint is
:mod:`verl.rollout.openai_server` (records: :mod:`verl.rollout.openai_records`, prefix
stitching: :mod:`verl.rollout.openai_stitching`, response bodies:
:mod:`verl.rollout.openai_responses`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from verl.rollout.agent_loop import EngineTurnGenerator, TurnGenerator
from verl.rollout.agent_runs import AgentRun, AgentRunner, AgentSpec, load_agent, plain
from verl.rollout.agent_trajectory import AGENT_KEYS, assemble_agent_batch
from verl.rollout.base import SamplingParams, validate_prompts
from verl.rollout.openai_records import PendingRequest, Record, RequestRefused
from verl.rollout.openai_server import OpenAIEndpoint
from verl.rollout.openai_stitching import build_context
from verl.rollout.tool_calls import ChatDeltaRenderer, parse_tool_calls

logger = logging.getLogger(__name__)

__all__ = [
    "AGENT_KEYS",
    "AgentProgramRollout",
    "build_agent_program",
    "load_agent",
]

# How long the rollout thread waits for a request before checking on the agents, and how
# long it lets a batch fill once a request came in (unless every running agent has one).
POLL_S = 0.05
SETTLE_S = 0.02


# ---------------------------------------------------------------------------- the rollout
@dataclass
class _Job:
    pending: PendingRequest
    context: Any
    messages: list[dict[str, Any]] | None
    budget: int
    stops: tuple[str, ...]
    logprobs: bool
    tools: bool


class AgentProgramRollout:
    """Rollouts by agent programs over a rollout engine (see the module docstring).

    Args:
        generator: the backend (:class:`~verl.rollout.agent_loop.TurnGenerator`), or a
            :class:`~verl.rollout.base.RolloutEngine` (wrapped in ``EngineTurnGenerator``).
        tokenizer: tokenizes requests with its chat template and decodes responses.
        agent: an :class:`AgentSpec` (:func:`load_agent`) or a callable.
        concurrency: agents running at once, >= 1.
        timeout_s: seconds an agent may run, > 0.
        max_requests: model requests one agent may make; more are refused (429).
        max_prompt_length: the longest first prompt of a trajectory (an agent writes its
            own prompt) and the output's prompt width; None: the input's prompt width.
        eos_token_ids / pad_token_id: default to the engine's, else the tokenizer's.
    """

    def __init__(
        self,
        generator: Any,
        tokenizer: Any,
        agent: AgentSpec | Callable[..., Any],
        *,
        concurrency: int = 16,
        timeout_s: float = 300.0,
        max_requests: int = 64,
        max_prompt_length: int | None = None,
        eos_token_ids: list[int] | None = None,
        pad_token_id: int | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"rollout.agent.concurrency={concurrency} must be >= 1")
        if not timeout_s > 0:
            raise ValueError(f"rollout.agent.timeout_s={timeout_s} must be > 0 seconds")
        if not hasattr(generator, "generate_turns"):
            generator = EngineTurnGenerator(generator, stop_strings=())
        self.generator: TurnGenerator = generator
        self.tokenizer = tokenizer
        self.agent = agent if isinstance(agent, AgentSpec) else load_agent(program=agent)
        self.concurrency = concurrency
        self.timeout_s = float(timeout_s)
        self.max_prompt_length = max_prompt_length
        engine = getattr(generator, "engine", None)
        if eos_token_ids is None:
            eos_token_ids = list(getattr(engine, "eos_token_ids", None) or [])
            if not eos_token_ids and tokenizer.eos_token_id is not None:
                eos_token_ids = [tokenizer.eos_token_id]
        self.eos_token_ids = set(eos_token_ids)
        if pad_token_id is None:
            pad_token_id = getattr(engine, "pad_token_id", None)
        if pad_token_id is None:
            pad_token_id = tokenizer.pad_token_id or 0
        self.pad_token_id = int(pad_token_id)
        try:
            self.renderer: ChatDeltaRenderer | None = ChatDeltaRenderer(
                tokenizer, list(self.eos_token_ids)
            )
        except ValueError:  # no chat template, or one that is not append-only: text matching
            self.renderer = None
        self.endpoint = OpenAIEndpoint(tokenizer, max_requests=max_requests)
        self._runner = AgentRunner(self.agent, self.endpoint)
        self._warned: set[str] = set()

    def close(self) -> None:
        """Stop the endpoint (its server thread); the worker calls it at shutdown."""
        self.endpoint.stop()

    # ------------------------------------------------------------------ public
    def run(self, prompts: Any, params: SamplingParams) -> Any:
        """``params.n`` agent runs per prompt; the layout of ``verl.rollout.base`` (masks:
        module docstring) plus the per-sample columns ``messages``, ``turn_info``,
        :data:`AGENT_KEYS` and ``extra_info`` with the agent's reward."""
        input_ids, attention_mask, _ = validate_prompts(prompts)
        base_url = self.endpoint.start()
        width = max(input_ids.shape[1], self.max_prompt_length or 0)
        non_tensor = getattr(prompts, "non_tensor_batch", None) or {}
        runs = []
        for row, (ids, mask) in enumerate(zip(input_ids.cpu(), attention_mask.cpu())):
            prompt_ids = ids[mask.bool()].tolist()
            for sample in range(params.n):
                task = self._task(non_tensor, row, sample, prompt_ids)
                index = len(runs)
                runs.append(
                    AgentRun(row=index, task=task, session=self.endpoint.open_session(index))
                )
        try:
            self._drive(runs, base_url, params, width)
        finally:
            for run in runs:
                self._runner.stop(run)
            self.endpoint.refuse_queued()
        return assemble_agent_batch(
            prompts,
            params,
            runs,
            width,
            pad_token_id=self.pad_token_id,
            counters=self.endpoint.counters,
            warned=self._warned,
        )

    # ------------------------------------------------------------------ tasks
    def _task(
        self, non_tensor: Mapping[str, Any], row: int, sample: int, prompt_ids: list[int]
    ) -> dict[str, Any]:
        def column(key: str) -> Any:
            return plain(non_tensor[key][row]) if key in non_tensor else None

        messages = column("raw_prompt")
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        return {
            "messages": messages,
            "prompt": self.tokenizer.decode(prompt_ids, skip_special_tokens=False),
            "data_source": column("data_source"),
            "ground_truth": column("ground_truth"),
            "extra_info": column("extra_info"),
            "row": row,
            "sample": sample,
        }

    # ------------------------------------------------------------------ the loop
    def _drive(self, runs: list[AgentRun], base_url: str, params: SamplingParams, width: int):
        waiting = list(runs)
        running: list[AgentRun] = []
        rounds = 0
        while waiting or running:
            while waiting and len(running) < self.concurrency:
                run = waiting.pop(0)
                self._runner.start(run, base_url)
                running.append(run)
            batch = self.endpoint.take(POLL_S, SETTLE_S, len(running))
            if batch:
                self._serve(batch, params, width, rounds)
                rounds += 1
            now = time.monotonic()
            still = []
            for run in running:
                if run.done.is_set():
                    self.endpoint.close_session(run.session)
                elif now - run.started > self.timeout_s:
                    self._runner.finish(
                        run, "timeout", error=f"ran past rollout.agent.timeout_s={self.timeout_s:g}"
                    )
                    self._runner.stop(run)
                    logger.warning(
                        "agent %s (row %d) ran past timeout_s=%g and was stopped",
                        self.agent.name,
                        run.row,
                        self.timeout_s,
                    )
                else:
                    still.append(run)
            running = still

    def _prepare(self, p: PendingRequest, params: SamplingParams, width: int) -> _Job:
        body, session = p.body, p.session
        if not session.open:
            raise RequestRefused(403, "this rollout has ended", "rollout_ended", "permission_error")
        for key, allowed in (("n", (None, 1)), ("echo", (None, False)), ("suffix", (None, ""))):
            if body.get(key) not in allowed:
                raise RequestRefused(
                    400, f"{key}={body.get(key)!r} is not supported here", "unsupported"
                )
        top = body.get("top_logprobs") if p.endpoint == "chat" else body.get("logprobs")
        if p.endpoint == "chat" and top is not None and top != 0:
            raise RequestRefused(
                400,
                f"top_logprobs={top!r}: the rollout engine reports the sampled token's "
                "log-prob only, not alternatives; ask for logprobs=true without top_logprobs",
                "unsupported",
            )
        if p.endpoint != "chat" and not isinstance(top, bool) and isinstance(top, int) and top:
            # ``logprobs=N`` is also the completions API's way to ask for log-probs at all:
            # served with the sampled tokens' log-probs, empty alternatives, counted.
            self.endpoint._count("top_logprobs_unavailable")
            if "top_logprobs" not in self._warned:
                self._warned.add("top_logprobs")
                logger.warning(
                    "an agent asked for logprobs=%s; completions carry each sampled token's "
                    "log-prob and empty top_logprobs (the engine reports no alternatives)",
                    top,
                )
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 1
        ):
            raise RequestRefused(400, f"max_tokens={limit!r} must be an int >= 1", "bad_max_tokens")
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise RequestRefused(400, f"stop={body.get('stop')!r} must be strings", "bad_stop")
        if len(session.records) >= self.endpoint.max_requests:
            raise RequestRefused(
                429,
                f"this rollout made {len(session.records)} requests, the limit "
                "(rollout.agent.max_requests)",
                "too_many_requests",
                "rate_limit_error",
            )
        for key, value in (("temperature", params.temperature), ("top_p", params.top_p)):
            asked = body.get(key)
            if asked is not None and asked != value:
                self.endpoint._count("sampling_overridden")
                if key not in self._warned:
                    self._warned.add(key)
                    logger.warning(
                        "an agent asked for %s=%s; rollouts sample with the rollout's %s=%s so "
                        "that the recorded log-probs are the trained policy's",
                        key,
                        asked,
                        key,
                        value,
                    )
        context, messages = build_context(self.tokenizer, session, p.endpoint, body, self.renderer)
        if context.prompt_len > width:
            raise RequestRefused(
                400,
                f"the prompt has {context.prompt_len} tokens, more than the rollout's prompt "
                f"width {width} (data.max_prompt_length)",
                "context_length_exceeded",
            )
        left = params.max_new_tokens - (len(context.ids) - context.prompt_len)
        if left < 1:
            raise RequestRefused(
                400,
                f"this conversation used its {params.max_new_tokens} response tokens "
                "(data.max_response_length: model and inserted tokens together)",
                "context_length_exceeded",
            )
        logprobs = (
            bool(body.get("logprobs"))
            if p.endpoint == "chat"
            else (body.get("logprobs") is not None)
        )
        return _Job(
            pending=p,
            context=context,
            messages=messages,
            budget=min(limit or left, left),
            stops=tuple(stop),
            logprobs=logprobs,
            tools=bool(body.get("tools")),
        )

    def _serve(
        self, batch: list[PendingRequest], params: SamplingParams, width: int, rounds: int
    ) -> None:
        """Answer a batch of requests; on an error of the engine (or of this code) every
        request of the batch still open is answered with 500 and the error is raised."""
        try:
            self._serve_batch(batch, params, width, rounds)
        except BaseException:
            for p in batch:
                p.refuse(
                    RequestRefused(500, "the rollout engine failed", "engine_error", "server_error")
                )
            raise

    def _serve_batch(
        self, batch: list[PendingRequest], params: SamplingParams, width: int, rounds: int
    ) -> None:
        groups: dict[tuple[str, ...], list[_Job]] = {}
        for p in batch:
            try:
                job = self._prepare(p, params, width)
            except RequestRefused as exc:
                p.session.refused += 1
                self.endpoint._count("after_end" if exc.status == 403 else f"refused_{exc.status}")
                p.refuse(exc)
                continue
            groups.setdefault(job.stops, []).append(job)
        for g, (stops, jobs) in enumerate(groups.items()):
            seed = None if params.seed is None else params.seed + 1009 * rounds + g
            turn_params = dataclasses.replace(
                params,
                n=1,
                seed=seed,
                stop_strings=[
                    *params.stop_strings,
                    *(s for s in stops if s not in params.stop_strings),
                ],
            )
            outs = self.generator.generate_turns(
                [j.context.ids for j in jobs], [j.budget for j in jobs], turn_params
            )
            if len(outs) != len(jobs):
                raise RuntimeError(f"generate_turns returned {len(outs)} turns for {len(jobs)}")
            for job, out in zip(jobs, outs):
                versions = None if out.versions is None else [int(v) for v in out.versions]
                self._answer(
                    job, list(out.ids), [float(x) for x in out.log_probs], turn_params, versions
                )

    def _answer(
        self,
        job: _Job,
        ids: list[int],
        log_probs: list[float],
        params: SamplingParams,
        versions: list[int] | None = None,
    ) -> None:
        text = self.tokenizer.decode(
            ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        finish = "length" if len(ids) >= job.budget else "stop"
        if ids and ids[-1] in self.eos_token_ids:
            finish = "stop"
        cut = [text.find(s) for s in params.stop_strings if s in text]
        if cut:
            text, finish = text[: min(cut)], "stop"
        reply = None
        if job.messages is not None:
            reply = {"role": "assistant", "content": text}
            calls = [c for c in parse_tool_calls(text) if c.error is None] if job.tools else []
            if calls:
                reply["content"] = text[: text.find("<tool_call>")].strip() or None
                reply["tool_calls"] = [
                    {
                        "id": f"call_{uuid.uuid4().hex[:12]}",
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                    }
                    for c in calls
                ]
                finish = "tool_calls"
        c = job.context
        record = Record(
            endpoint=job.pending.endpoint,
            context=c.ids,
            flags=c.flags,
            context_log_probs=c.log_probs,
            prompt_len=c.prompt_len,
            parent=c.parent,
            sampled=ids,
            log_probs=log_probs,
            finish_reason=finish,
            text=text,
            stitch=c.stitch,
            kept=c.kept,
            messages=job.messages,
            reply=reply,
            versions=versions,
            context_versions=None if versions is None else c.versions,
        )
        session = job.pending.session
        session.records.append(record)
        session.stitching[c.stitch] += 1
        job.pending.answer(record, job.logprobs)


# ---------------------------------------------------------------------------- the worker
def build_agent_program(config: Any, rollout: Any, tokenizer: Any) -> AgentProgramRollout:
    """The agent-program rollout of ``actor_rollout_ref.rollout.agent`` over the worker's
    rollout engine (``config``: the trainer config). Raises ``ValueError`` when
    ``rollout.multi_turn.enable`` is set too (one or the other generates)."""
    rollout_cfg = config.actor_rollout_ref.rollout
    agent_cfg = rollout_cfg.agent
    if rollout_cfg.multi_turn.enable:
        raise ValueError(
            "actor_rollout_ref.rollout.agent and rollout.multi_turn.enable=true both generate "
            "the rollouts; set one (an agent program runs its own tool loop)"
        )
    spec = load_agent(agent_cfg.program, agent_cfg.command)
    manager = getattr(getattr(config, "reward_model", None), "reward_manager", None)
    if manager != "agent":
        logger.warning(
            "rollout.agent is set with reward_model.reward_manager=%s, which ignores the "
            "rewards agents return (and scores failed agents' empty rows); set "
            "reward_model.reward_manager=agent to use them",
            manager,
        )
    return AgentProgramRollout(
        EngineTurnGenerator(rollout, stop_strings=()),
        tokenizer,
        spec,
        concurrency=agent_cfg.concurrency,
        timeout_s=agent_cfg.timeout_s,
        max_requests=agent_cfg.max_requests,
        max_prompt_length=config.data.max_prompt_length,
    )

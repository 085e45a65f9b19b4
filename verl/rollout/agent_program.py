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
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from verl.rewards.results import ERROR, TIMEOUT, check_bound, coerce_result, failed
from verl.rewards.manager import RewardManager
from verl.rollout.agent_loop import EngineTurnGenerator, TurnGenerator
from verl.rollout.base import SamplingParams, assemble_rollout_output, validate_prompts
from verl.rollout.openai_server import (
    OpenAIEndpoint,
    PendingRequest,
    Record,
    RequestRefused,
    Session,
    build_context,
)
from verl.rollout.tool_calls import ChatDeltaRenderer, parse_tool_calls

logger = logging.getLogger(__name__)

__all__ = [
    "AGENT_KEYS",
    "AgentProgramRollout",
    "AgentRewardManager",
    "agent_program_metrics",
    "build_agent_program",
    "load_agent",
]

#: Per-sample columns of the output's non_tensor_batch (besides ``messages``,
#: ``turn_info`` and the updated ``extra_info``).
AGENT_KEYS = (
    "agent_status",
    "agent_error",
    "agent_requests",
    "agent_untrained_requests",
    "agent_refused_requests",
    "agent_seconds",
    "agent_unauthorized_total",
    "agent_late_total",
)
STATUSES = ("ok", "error", "timeout", "no_requests")
# How long the rollout thread waits for a request before checking on the agents, and how
# long it lets a batch fill once a request came in (unless every running agent has one).
POLL_S = 0.05
SETTLE_S = 0.02
# Characters of a failed agent's error (or a command's stderr) kept.
MAX_ERROR_CHARS = 2000


# ---------------------------------------------------------------------------- agents
@dataclass
class AgentSpec:
    """A loaded agent: a callable or a command's argv (exactly one)."""

    fn: Callable[..., Any] | None = None
    argv: list[str] | None = None
    name: str = ""


def load_agent(program: Any = None, command: str | list[str] | None = None) -> AgentSpec:
    """The agent of ``rollout.agent``: ``program`` (a callable, ``module:function`` or
    ``path/to/file.py:function``) or ``command`` (a command line, split like a shell's,
    run without one). Raises ``ValueError`` naming the problem and the fix."""
    if (program is None) == (command is None or command == [] or command == ""):
        raise ValueError(
            "rollout.agent needs exactly one of program (module:function or "
            f"file.py:function) and command; got program={program!r}, command={command!r}"
        )
    if command:
        argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
        return AgentSpec(argv=argv, name=" ".join(argv))
    if callable(program):
        return AgentSpec(fn=program, name=getattr(program, "__qualname__", repr(program)))
    from verl.utils.import_path import is_import_path, resolve_import_path

    if not isinstance(program, str) or ":" not in program:
        raise ValueError(
            f"rollout.agent.program={program!r} must be module:function or file.py:function"
        )
    if is_import_path(program):
        fn = resolve_import_path(program)
    else:
        from verl.utils.file_import import load_callable

        path, name = program.rsplit(":", 1)
        _, fn = load_callable(
            path, name, "agent program file", "set rollout.agent.program to file.py:function"
        )
    if not callable(fn):
        raise TypeError(f"rollout.agent.program={program!r} is a {type(fn).__name__}, not callable")
    return AgentSpec(fn=fn, name=program)


@dataclass
class _Run:
    """One agent run: its task, session, thread (and process) and outcome."""

    row: int
    task: dict[str, Any]
    session: Session
    status: str = "pending"
    reward: Any = None
    error: str | None = None
    started: float = 0.0
    seconds: float = 0.0
    thread: threading.Thread | None = None
    process: subprocess.Popen | None = None
    done: threading.Event = field(default_factory=threading.Event)
    cancelled: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


def _short(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def _plain(value: Any) -> Any:
    """numpy scalars / arrays in a task as plain Python (JSON-able where possible)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


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
                runs.append(_Run(row=index, task=task, session=self.endpoint.open_session(index)))
        try:
            self._drive(runs, base_url, params, width)
        finally:
            for run in runs:
                self._stop(run)
            self.endpoint.refuse_queued()
        return self._assemble(prompts, params, runs, width)

    # ------------------------------------------------------------------ tasks / agents
    def _task(
        self, non_tensor: Mapping[str, Any], row: int, sample: int, prompt_ids: list[int]
    ) -> dict[str, Any]:
        def column(key: str) -> Any:
            return _plain(non_tensor[key][row]) if key in non_tensor else None

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

    def _start(self, run: _Run, base_url: str) -> None:
        run.started = time.monotonic()
        run.status = "running"
        key = run.session.key
        target = self._call_fn if self.agent.fn is not None else self._call_command
        run.thread = threading.Thread(
            target=target,
            args=(run, base_url, key),
            daemon=True,
            name=f"verl-agent-{run.row}-{uuid.uuid4().hex[:6]}",
        )
        run.thread.start()

    def _finish(self, run: _Run, status: str, reward: Any = None, error: str | None = None):
        with run.lock:
            if run.done.is_set():
                return
            run.status, run.reward, run.error = status, reward, error
            run.seconds = time.monotonic() - run.started
            run.done.set()
        self.endpoint.wake()

    def _call_fn(self, run: _Run, base_url: str, key: str) -> None:
        try:
            value = self.agent.fn(base_url, key, run.task)
            if inspect.iscoroutine(value):
                value = asyncio.run(value)
        except BaseException as exc:  # the agent's failure is counted, never raised
            self._finish(run, "error", error=_short(f"{type(exc).__name__}: {exc}"))
            if not isinstance(exc, Exception):
                raise
            return
        self._finish(run, "ok", reward=_plain(value))

    def _call_command(self, run: _Run, base_url: str, key: str) -> None:
        env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key}
        try:
            with run.lock:
                if run.cancelled:
                    return
                run.process = subprocess.Popen(
                    self.agent.argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=env,
                    text=True,
                    start_new_session=True,  # its own process group: killed as one
                )
            out, err = run.process.communicate(json.dumps(run.task, default=str))
        except OSError as exc:
            self._finish(run, "error", error=f"cannot run {self.agent.argv!r}: {exc}")
            return
        if run.process.returncode != 0:
            self._finish(
                run,
                "error",
                error=_short(
                    f"exited with status {run.process.returncode}; stderr: {err[-1000:]!r}"
                ),
            )
            return
        lines = [line for line in out.splitlines() if line.strip()]
        try:
            value = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            value = lines
        if not lines or isinstance(value, list):
            self._finish(
                run,
                "error",
                error="the last line of its stdout is not JSON (print the reward, e.g. 1.0, "
                f'{{"score": 1.0}} or null); stdout ends {out[-200:]!r}',
            )
            return
        self._finish(run, "ok", reward=value)

    def _stop(self, run: _Run) -> None:
        """Close the run's key; kill its command; mark it timed out if it still runs."""
        self.endpoint.close_session(run.session)
        if run.status == "pending":
            self._finish(run, "error", error="never started: the rollout stopped first")
        with run.lock:
            run.cancelled = True
            process = run.process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        if run.thread is not None and self.agent.argv is not None:
            run.thread.join(10.0)  # communicate() returns once the process is gone
        if process is not None:
            try:
                process.wait(10.0)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "agent command %s (pid %d) did not exit", self.agent.name, process.pid
                )

    # ------------------------------------------------------------------ the loop
    def _drive(self, runs: list[_Run], base_url: str, params: SamplingParams, width: int):
        waiting = list(runs)
        running: list[_Run] = []
        rounds = 0
        while waiting or running:
            while waiting and len(running) < self.concurrency:
                run = waiting.pop(0)
                self._start(run, base_url)
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
                    self._finish(
                        run, "timeout", error=f"ran past rollout.agent.timeout_s={self.timeout_s:g}"
                    )
                    self._stop(run)
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
                self._answer(job, list(out.ids), [float(x) for x in out.log_probs], turn_params)

    def _answer(
        self, job: _Job, ids: list[int], log_probs: list[float], params: SamplingParams
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
        )
        session = job.pending.session
        session.records.append(record)
        session.stitching[c.stitch] += 1
        job.pending.answer(record, job.logprobs)

    # ------------------------------------------------------------------ output
    def _assemble(
        self,
        prompts: Any,
        params: SamplingParams,
        runs: list[_Run],
        width: int,
    ) -> Any:
        from verl.protocol import DataProto

        rows, budget = len(runs), params.max_new_tokens
        input_ids = prompts.batch["input_ids"].cpu()
        input_mask = prompts.batch["attention_mask"].cpu()
        prompt_ids = torch.full((rows, width), self.pad_token_id, dtype=torch.long)
        prompt_mask = torch.zeros((rows, width), dtype=input_mask.dtype)
        responses = torch.full((rows, budget), self.pad_token_id, dtype=torch.long)
        response_mask = torch.zeros((rows, budget), dtype=torch.long)
        real = torch.zeros((rows, budget), dtype=torch.long)
        log_probs = torch.zeros((rows, budget), dtype=torch.float32)
        columns: dict[str, list[Any]] = {k: [] for k in ("messages", "turn_info", *AGENT_KEYS)}
        extra_infos = []
        counters = self.endpoint.counters
        for r, run in enumerate(runs):
            records = run.session.records
            status = run.status
            if status == "ok" and not records:
                status = "no_requests"
            chain: list[int] = []
            kept: list[int] = []
            if status == "ok":
                index: int | None = len(records) - 1
                while index is not None:
                    chain.append(index)
                    index = records[index].parent
                chain.reverse()
                last = records[chain[-1]]
                prompt = last.context[: last.prompt_len]
                response = last.context[last.prompt_len :] + last.sampled
                mask = last.flags[last.prompt_len :] + [1] * len(last.sampled)
                lps = last.context_log_probs[last.prompt_len :] + last.log_probs
                if len(response) > budget:  # the endpoint's budget check makes this impossible
                    raise RuntimeError(f"agent row {r}: {len(response)} response tokens > {budget}")
                n = len(response)
                responses[r, :n] = torch.tensor(response, dtype=torch.long)
                response_mask[r, :n] = torch.tensor(mask, dtype=torch.long)
                real[r, :n] = 1
                log_probs[r, :n] = torch.tensor(lps, dtype=torch.float32)
                columns["messages"].append(self._messages(records, chain))
            else:  # nothing of a failed agent is trained: its dataset prompt, no response
                source = r // params.n
                prompt = input_ids[source][input_mask[source].bool()].tolist()
                columns["messages"].append([])
            prompt_ids[r, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            prompt_mask[r, width - len(prompt) :] = 1
            # of each request of the chain, the sampled ids that are in the row
            kept = [records[i].kept for i in chain[1:]] + [
                len(records[i].sampled) for i in chain[-1:]
            ]
            columns["turn_info"].append(
                [
                    {
                        "model_tokens": len(records[i].sampled),
                        "trained_tokens": k,
                        "finish_reason": records[i].finish_reason,
                        "endpoint": records[i].endpoint,
                        "stitch": records[i].stitch,
                    }
                    for i, k in zip(chain, kept)
                ]
            )
            columns["agent_status"].append(status)
            columns["agent_error"].append(run.error)
            columns["agent_requests"].append(len(records))
            columns["agent_untrained_requests"].append(len(records) - sum(k > 0 for k in kept))
            columns["agent_refused_requests"].append(run.session.refused)
            columns["agent_seconds"].append(run.seconds)
            columns["agent_unauthorized_total"].append(counters["unauthorized"])
            columns["agent_late_total"].append(counters["after_end"])
            info = run.task["extra_info"]
            info = dict(info) if isinstance(info, Mapping) else {}
            extra_infos.append(
                info
                | {"agent_reward": run.reward, "agent_status": status, "agent_error": run.error}
            )
        given = sum(1 for run in runs if run.reward is not None)
        if given and "reward_manager" not in self._warned:
            self._warned.add("reward_manager")
            logger.info(
                "%d of %d agents returned a reward; reward_model.reward_manager=agent uses it",
                given,
                rows,
            )
        statuses = [c for c in columns["agent_status"] if c != "ok"]
        if statuses:
            logger.warning(
                "agent rollouts: %s of %d did not finish normally",
                {s: statuses.count(s) for s in set(statuses)},
                rows,
            )
        src_non_tensor = {
            k: np.repeat(v, params.n, axis=0) for k, v in prompts.non_tensor_batch.items()
        }
        tensors = {
            k: v.cpu().repeat_interleave(params.n, dim=0)
            for k, v in prompts.batch.items()
            if k not in ("input_ids", "attention_mask", "position_ids")
        }
        position_ids = (prompt_mask.long().cumsum(-1) - 1).clamp_min(0)
        rolled = DataProto.from_dict(
            tensors={
                **tensors,
                "input_ids": prompt_ids,
                "attention_mask": prompt_mask,
                "position_ids": position_ids,
            },
            non_tensors=src_non_tensor,
            meta_info=dict(prompts.meta_info),
        )
        device = prompts.batch["input_ids"].device
        out = assemble_rollout_output(
            rolled.to(device), dataclasses.replace(params, n=1), responses, response_mask, log_probs
        )
        attention = out.batch["attention_mask"]
        attention[:, -budget:] = real.to(device=attention.device, dtype=attention.dtype)
        columns["extra_info"] = extra_infos
        for key, values in columns.items():
            column = np.empty(rows, dtype=object)  # element-wise: a list stays one object
            for i, value in enumerate(values):
                column[i] = value
            out.non_tensor_batch[key] = column
        return out

    def _messages(self, records: list[Record], chain: list[int]) -> list[dict[str, Any]]:
        """The conversation after the chain's first prompt: for chat, the last request's
        messages past the first request's, then the last reply; for completions, each
        turn's text as an assistant message."""
        first, last = records[chain[0]], records[chain[-1]]
        if last.messages is not None and first.messages is not None:
            return [*last.messages[len(first.messages) :], dict(last.reply or {})]
        return [{"role": "assistant", "content": records[i].text} for i in chain]


# ---------------------------------------------------------------------------- metrics
def agent_program_metrics(non_tensor: Any) -> dict[str, float]:
    """``agent/*`` metrics of a batch from agent programs (empty for other batches)."""
    if "agent_status" not in non_tensor:
        return {}
    status = list(non_tensor["agent_status"])
    requests = np.asarray(non_tensor["agent_requests"], dtype=np.float64)
    out = {f"agent/{s if s != 'error' else 'errors'}": float(status.count(s)) for s in STATUSES}
    out["agent/timeouts"] = out.pop("agent/timeout")
    out |= {
        "agent/requests": float(requests.sum()),
        "agent/requests_mean": float(requests.mean()) if requests.size else 0.0,
        "agent/untrained_requests": float(np.sum(non_tensor["agent_untrained_requests"])),
        "agent/refused_requests": float(np.sum(non_tensor["agent_refused_requests"])),
        "agent/seconds_max": float(np.max(non_tensor["agent_seconds"], initial=0.0)),
        "agent/unauthorized_requests_total": float(
            np.max(non_tensor["agent_unauthorized_total"], initial=0)
        ),
        "agent/late_requests_total": float(np.max(non_tensor["agent_late_total"], initial=0)),
    }
    return out


# ---------------------------------------------------------------------------- rewards
class AgentRewardManager(RewardManager):
    """The reward manager of agent programs (``reward_model.reward_manager=agent``).

    A row whose ``extra_info`` has an ``agent_reward`` gets that reward (checked like a
    reward function's result: a number or a dict with ``score``, finite, within
    ``max_abs_reward``); a row whose agent failed (``agent_status`` ``error`` or
    ``timeout``) is a failed reward call (score 0, counted as ``reward/errors`` or
    ``reward/timeouts``, and part of the failure rate that stops a run); the other rows are
    scored as by the default manager (the built-in scorers or the custom function).
    """

    def _score(self, kwargs_list: list[dict[str, Any]]) -> list[Any]:
        results: list[Any] = [None] * len(kwargs_list)
        rest: list[int] = []
        own: list[int] = []
        for i, kw in enumerate(kwargs_list):
            info = kw.get("extra_info")
            info = info if isinstance(info, Mapping) else {}
            status = info.get("agent_status")
            if status in ("error", "timeout"):
                kind = ERROR if status == "error" else TIMEOUT
                results[i] = failed(kind, f"agent {status}: {info.get('agent_error')}")
            elif info.get("agent_reward") is not None:
                results[i] = check_bound(coerce_result(info["agent_reward"]), self.max_abs_reward)
            else:
                rest.append(i)
                continue
            own.append(i)
        if rest:
            for i, result in zip(rest, super()._score([kwargs_list[i] for i in rest])):
                results[i] = result
        for i in own:
            self.failures.record(results[i], f"agent of sample {i}")
        if own:
            self._stop_if_failing([kwargs_list[i] for i in own], [results[i] for i in own], {})
        return results


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

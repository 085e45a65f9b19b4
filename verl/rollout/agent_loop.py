"""The agent loop: multi-turn rollouts in which the model calls tools.

For each sample: generate until a tool call, the end of the turn or the token budget;
parse the ``<tool_call>`` blocks of the turn (``verl.rollout.tool_calls``); run the tools;
append their results as ``tool`` messages; continue, up to ``max_turns`` model turns and
``params.max_new_tokens`` response tokens in all (model and tool tokens together).

**Exact ids.** The context of a turn is the prompt's ids followed by every id produced so
far, model and tool alike; nothing is decoded and re-encoded. Tool messages are appended
as the chat template's delta (:class:`~verl.rollout.tool_calls.ChatDeltaRenderer`), in
which the text of tool results and interaction replies is plain text: a special token
written inside it (``<|im_end|>``) is not a turn boundary.

**Interaction.** An optional ``interaction`` (``verl.tools.interaction``) is the
environment: after a model turn without a tool call it is called with the conversation so
far and the sample's ``data_source`` / ``ground_truth`` / ``extra_info`` (from the prompts'
``non_tensor_batch`` when present) and either returns feedback, appended as a ``user``
message (the same delta rendering as tool results, mask 0) after which the model writes
another turn, or ``None``, which ends the sample. Without one, such a turn ends the sample.

**Masks.** The output has the layout of ``verl.rollout.base`` with one difference that
the trainer already honours: ``response_mask`` is 1 on the model's tokens only (0 on tool
and template tokens), while the response part of ``attention_mask`` is 1 on every real
token. ``rollout_log_probs`` holds the model tokens' log-probs (0 elsewhere). The losses
read ``response_mask``; the forward passes read ``attention_mask``. A trajectory always
ends with model tokens: when a tool result would not leave room for one more model token,
the sample ends before it.

**Concurrency.** The loop runs in rounds: one batched ``generate_turns`` call for every
sample still running, then the tool calls of the round, at most
``max_parallel_tool_calls`` at a time (daemon threads started for the round; the others
wait for a free one), all within ``tool_timeout`` of the round's start. A finished sample
leaves the batch, so a batch where one sample takes 5 turns and the others 1 costs one
full round and four rounds of one sample. Rounds keep rollouts reproducible for a fixed
seed whatever the tools' timing; continuous batching belongs to asynchronous backends.

**Failures never end the step.** A malformed call (including one past the parser's
bounds: ``verl.rollout.tool_calls``), an unknown tool, a tool that raises (``SystemExit``
and ``KeyboardInterrupt`` included: raised in a tool thread they are the tool's, while a
real Ctrl-C reaches the driver's main thread and stops the run), runs past
``tool_timeout`` or returns something other than text gives the model an ``Error: ...``
message as the tool's result, and is counted (``num_tool_errors``, of which
``num_tool_parse_errors`` could not be read as calls, and ``num_tool_timeouts`` per
sample; :func:`multi_turn_metrics`). A call that has not started by the deadline never
starts. A thread cannot be killed: a timed-out Python tool keeps its thread until it
returns, and such threads count against ``max_parallel_tool_calls`` (when all are held,
later calls fail at once), so the loop never holds more tool threads than that. Tools that
may hang should stop by ``verl.tools.base.time_left()``; the built-in ``python`` tool
kills its sandbox at the call's deadline. A call that returns or fails at or after its
deadline is a timeout too (such a tool's return races the round's wait).

**Bounded results.** A tool result is cut to ``max_tool_response_tokens`` *
:data:`BYTES_PER_TOKEN` bytes of UTF-8 before it is tokenized (a 50 MB result costs a
slice, not a tokenization), then to ``max_tool_response_tokens`` tokens.

The loop drives any backend through :class:`TurnGenerator` (a context of ids in, the new
ids and their log-probs out); :class:`EngineTurnGenerator` adapts every
:class:`~verl.rollout.base.RolloutEngine` (both in :mod:`verl.rollout.agent_turns`).

**Per-token versions.** With partial rollouts (a weight mailbox in force) each turn returns
its tokens' policy versions and the output has ``rollout_token_versions``: a model token's
is the version that sampled it, a tool or template token's -1
(:func:`~verl.rollout.agent_turns.trajectory_versions`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from verl.rollout.agent_turns import (
    EngineTurnGenerator,
    TurnGenerator,
    TurnOutput,
    extend_versions,
    trajectory_versions,
)
from verl.rollout.base import SamplingParams, assemble_rollout_output, validate_prompts
from verl.rollout.partial import TOKEN_VERSIONS
from verl.rollout.tool_calls import ChatDeltaRenderer, ToolCall, parse_tool_calls
from verl.tools.base import call_deadline, time_left
from verl.tools.call_context import row_context

logger = logging.getLogger(__name__)

__all__ = [
    "AgentLoop",
    "EngineTurnGenerator",
    "TurnGenerator",
    "TurnOutput",
    "multi_turn_metrics",
]

# Per-sample columns of the output's non_tensor_batch.
TRAJECTORY_KEYS = (
    "messages",
    "num_turns",
    "num_tool_calls",
    "num_tool_errors",
    "num_tool_parse_errors",
    "num_tool_timeouts",
    "num_interaction_turns",
    "turn_info",
)
# A tool result is cut to max_tool_response_tokens * BYTES_PER_TOKEN bytes before it is
# tokenized: far more than the tokens kept need (a token averages ~4 bytes of text).
BYTES_PER_TOKEN = 16
DEFAULT_MAX_PARALLEL_TOOL_CALLS = 8
# Per-prompt columns of the prompts' non_tensor_batch an interaction receives.
CONTEXT_KEYS = ("data_source", "ground_truth", "extra_info")


def _past_deadline() -> bool:
    """Whether the deadline of the tool call running in this thread has passed."""
    left = time_left()
    return left is not None and left <= 0


@dataclass
class _ToolResult:
    text: str
    error: bool = False
    timed_out: bool = False
    parse_error: bool = False  # the model's block could not be read as a call


@dataclass
class _Sample:
    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] | None = field(default_factory=list)  # None: a turn had none
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_parse_errors: int = 0
    tool_timeouts: int = 0
    interaction_turns: int = 0
    # one dict per model turn: its token count, the tools it called and how each call
    # ended ("ok", "error", "timeout"), the interaction's feedback to it
    turn_info: list[dict[str, Any]] = field(default_factory=list)
    wants_reply: bool = False  # ended a turn without a tool call; the interaction answers
    done: bool = False
    prompt_messages: list[dict[str, Any]] = field(default_factory=list)
    context: dict[str, Any] = field(default_factory=dict)

    def append(
        self,
        ids: list[int],
        model: bool,
        log_probs: list[float] | None = None,
        versions: list[int] | None = None,
    ) -> None:
        self.ids += ids
        self.mask += [int(model)] * len(ids)
        self.log_probs += log_probs if log_probs is not None else [0.0] * len(ids)
        self.versions = extend_versions(self.versions, len(ids), model, versions)


class AgentLoop:
    """Multi-turn rollouts with tools (see the module docstring).

    Args:
        generator: the backend (:class:`TurnGenerator`).
        tokenizer: decodes model turns and renders tool messages with its chat template.
        tools: objects with ``name`` and ``__call__(**arguments) -> str``
            (:class:`verl.tools.Tool`); names must be unique.
        max_turns: model turns per sample, >= 1 (the last one gets no tool results).
        max_tool_response_tokens: a tool result longer than this is cut (token count of
            the result text, before the template wraps it; first cut to this many times
            :data:`BYTES_PER_TOKEN` bytes).
        tool_timeout: seconds a round's tool calls may run.
        max_parallel_tool_calls: tool calls that run at once (threads of this loop,
            including those still held by calls that timed out), >= 1.
        eos_token_ids: end-of-turn ids (default: the generator's engine's, else the
            tokenizer's eos).
        interaction: the environment's reply to a turn without a tool call,
            ``fn(messages, *, data_source, ground_truth, extra_info, num_replies) -> str |
            None`` (``verl.tools.interaction``); None: such a turn ends the sample.
    """

    def __init__(
        self,
        generator: TurnGenerator,
        tokenizer: Any,
        tools: Sequence[Any],
        *,
        max_turns: int = 4,
        max_tool_response_tokens: int = 256,
        tool_timeout: float = 10.0,
        eos_token_ids: list[int] | None = None,
        interaction: Callable[..., str | None] | None = None,
        max_parallel_tool_calls: int = DEFAULT_MAX_PARALLEL_TOOL_CALLS,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"multi_turn.max_turns={max_turns} must be >= 1")
        if max_tool_response_tokens < 1:
            raise ValueError(
                f"multi_turn.max_tool_response_tokens={max_tool_response_tokens} must be >= 1"
            )
        if not tool_timeout > 0:
            raise ValueError(f"multi_turn.tool_timeout={tool_timeout} must be > 0 seconds")
        if max_parallel_tool_calls < 1:
            raise ValueError(
                f"multi_turn.max_parallel_tool_calls={max_parallel_tool_calls} must be >= 1"
            )
        self.max_parallel_tool_calls = max_parallel_tool_calls
        # tool threads of earlier rounds whose call timed out and has not returned yet
        self._held: set[threading.Thread] = set()
        self.tools = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}; tool names must be unique")
            self.tools[tool.name] = tool
        self.generator = generator
        self.interaction = interaction
        self.tokenizer = tokenizer
        self.max_turns = max_turns
        self.max_tool_response_tokens = max_tool_response_tokens
        self.tool_timeout = tool_timeout
        if eos_token_ids is None:
            engine = getattr(generator, "engine", None)
            eos_token_ids = list(getattr(engine, "eos_token_ids", None) or [])
            if not eos_token_ids and tokenizer.eos_token_id is not None:
                eos_token_ids = [tokenizer.eos_token_id]
        self.eos_token_ids = set(eos_token_ids)
        self.renderer = ChatDeltaRenderer(tokenizer, list(self.eos_token_ids))

    # ------------------------------------------------------------------ public
    def run(self, prompts: Any, params: SamplingParams) -> Any:
        """``params.n`` multi-turn trajectories per prompt; the layout of
        ``verl.rollout.base`` (masks: module docstring) plus the per-sample
        ``non_tensor_batch`` columns of ``TRAJECTORY_KEYS``."""
        input_ids, attention_mask, position_ids = validate_prompts(prompts)
        budget = params.max_new_tokens
        non_tensor = getattr(prompts, "non_tensor_batch", None) or {}
        samples = [
            _Sample(
                prompt=ids[mask.bool()].tolist(),
                prompt_messages=_prompt_messages(non_tensor, row),
                context={k: non_tensor[k][row] for k in CONTEXT_KEYS if k in non_tensor},
            )
            for row, (ids, mask) in enumerate(zip(input_ids.cpu(), attention_mask.cpu()))
            for _ in range(params.n)
        ]
        rounds = 0
        while active := [s for s in samples if not s.done]:
            seed = None if params.seed is None else params.seed + rounds
            outs = self.generator.generate_turns(
                [s.prompt + s.ids for s in active],
                [budget - len(s.ids) for s in active],
                dataclasses.replace(params, n=1, seed=seed),
            )
            if len(outs) != len(active):
                raise RuntimeError(
                    f"generate_turns returned {len(outs)} turns for {len(active)} contexts"
                )
            calling = []
            for sample, out in zip(active, outs):
                calls = self._take_turn(sample, out, budget)
                if calls:
                    calling.append((sample, calls, out.ids[-1]))
            results = self._run_tools(
                [c for _, calls, _ in calling for c in calls],
                [s.context for s, calls, _ in calling for _ in calls],
            )
            for sample, calls, last_token in calling:
                mine, results = results[: len(calls)], results[len(calls) :]
                self._append_results(sample, calls, mine, last_token, budget)
            for sample, out in zip(active, outs):
                if sample.wants_reply:
                    self._reply(sample, out.ids[-1], budget)
            rounds += 1
        return self._assemble(prompts, params, samples, position_ids)

    # ------------------------------------------------------------------ turns
    def _take_turn(self, sample: _Sample, out: TurnOutput, budget: int) -> list[ToolCall]:
        """Append a model turn; the calls to run, or [] when the sample is finished."""
        if len(out.log_probs) != len(out.ids):
            raise RuntimeError(f"turn has {len(out.ids)} ids but {len(out.log_probs)} log-probs")
        sample.append(list(out.ids), True, [float(x) for x in out.log_probs], out.versions)
        sample.turns += 1
        text = self.tokenizer.decode(out.ids, skip_special_tokens=True)
        calls = parse_tool_calls(text)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls
            ]
        sample.messages.append(message)
        sample.turn_info.append(
            {"model_tokens": len(out.ids), "tool_calls": [c.name for c in calls]}
        )
        if sample.turns >= self.max_turns or len(sample.ids) >= budget:
            sample.done = True
            return []
        if not calls:
            sample.wants_reply = self.interaction is not None
            sample.done = not sample.wants_reply
        return calls

    def _reply(self, sample: _Sample, last_token: int, budget: int) -> None:
        """The interaction's answer to a turn without a tool call: a user turn, or the end."""
        sample.wants_reply = False
        reply = self.interaction(
            [*sample.prompt_messages, *sample.messages],
            **{k: sample.context.get(k) for k in CONTEXT_KEYS},
            num_replies=sample.interaction_turns,
        )
        if reply is None:
            sample.done = True
            return
        if not isinstance(reply, str):
            raise TypeError(
                f"interaction {getattr(self.interaction, '__name__', self.interaction)!r} "
                f"returned {type(reply).__name__}; it must return the user turn's text or None"
            )
        message = {"role": "user", "content": reply}
        delta = self.renderer.delta_ids([message], last_token)
        if len(sample.ids) + len(delta) >= budget:  # no room left for the model to answer
            sample.done = True
            return
        sample.interaction_turns += 1
        sample.turn_info[-1]["feedback"] = reply
        sample.messages.append(message)
        sample.append(delta, False)

    def _append_results(
        self,
        sample: _Sample,
        calls: list[ToolCall],
        results: list[_ToolResult],
        last_token: int,
        budget: int,
    ) -> None:
        sample.tool_calls += len(calls)
        sample.tool_errors += sum(r.error for r in results)
        sample.tool_parse_errors += sum(r.parse_error for r in results)
        sample.tool_timeouts += sum(r.timed_out for r in results)
        sample.turn_info[-1]["tool_status"] = [
            "timeout" if r.timed_out else "error" if r.error else "ok" for r in results
        ]
        messages = [
            {"role": "tool", "name": c.name or "invalid", "content": self._cut(r.text)}
            for c, r in zip(calls, results)
        ]
        delta = self.renderer.delta_ids(messages, last_token)
        if len(sample.ids) + len(delta) >= budget:  # no room left for the model to answer
            sample.done = True  # and the conversation ends with the call, as the ids do
            return
        sample.messages.extend(messages)
        sample.append(delta, False)

    def _cut(self, text: str) -> str:
        """``text`` within ``max_tool_response_tokens``: first cut in bytes (cheap, whatever
        the length), then in tokens of its plain-text encoding."""
        max_bytes = self.max_tool_response_tokens * BYTES_PER_TOKEN
        head = text[:max_bytes].encode("utf-8", "replace")  # a char is >= 1 byte
        cut = len(text) > max_bytes or len(head) > max_bytes
        if cut:
            text = head[:max_bytes].decode("utf-8", "ignore")  # drops a split last char
        ids = self.renderer.encode_plain(text)
        if len(ids) <= self.max_tool_response_tokens and not cut:
            return text
        if len(ids) > self.max_tool_response_tokens:
            text = self.tokenizer.decode(ids[: self.max_tool_response_tokens])
        return text + "...(truncated)"

    # ------------------------------------------------------------------ tools
    def _refusal(self, call: ToolCall) -> _ToolResult | None:
        """The result of a call that is not run (malformed, or no such tool), else None."""
        if call.error is not None:
            return _ToolResult(f"Error: {call.error}", error=True, parse_error=True)
        if call.name not in self.tools:
            return _ToolResult(
                f"Error: unknown tool {call.name!r}; available: {sorted(self.tools)}", error=True
            )
        return None

    def _call(self, call: ToolCall, row: dict[str, Any] | None = None) -> _ToolResult:
        refused = self._refusal(call)
        if refused is not None:
            return refused
        try:
            with row_context(row):  # the sample's row, for tools that read it
                value = self.tools[call.name](**call.arguments)
        except BaseException as exc:  # the tool's failure is the model's information
            # SystemExit / KeyboardInterrupt here were raised by the tool in its own thread
            # (a real Ctrl-C reaches the main thread, waiting in _run_tools, and stops the run)
            if _past_deadline():
                return self._timed_out(call)
            return _ToolResult(f"Error: {type(exc).__name__}: {exc}"[:2000], error=True)
        if _past_deadline():
            # a tool that bounds itself by the deadline (time_left: the Python sandbox) returns
            # when it is reached, racing the round's wait: it timed out either way
            return self._timed_out(call)
        if not isinstance(value, str):
            return _ToolResult(
                f"Error: tool {call.name!r} returned {type(value).__name__}, not text",
                error=True,
            )
        return _ToolResult(value)

    def _timed_out(self, call: ToolCall) -> _ToolResult:
        return _ToolResult(
            f"Error: tool {call.name!r} timed out after {self.tool_timeout:g} s",
            error=True,
            timed_out=True,
        )

    def _run_tools(
        self, calls: list[ToolCall], rows: list[dict[str, Any]] | None = None
    ) -> list[_ToolResult]:
        """Run the calls, at most ``max_parallel_tool_calls`` at once (threads started for
        this round, which end when the queue is empty); wait at most ``tool_timeout``.
        ``rows[i]``: the row of call ``i``'s sample (``verl.tools.call_context``)."""
        results: list[_ToolResult | None] = [self._refusal(c) for c in calls]
        queue = collections.deque(i for i, r in enumerate(results) if r is None)
        if not queue:
            return results  # type: ignore[return-value]
        self._held = {t for t in self._held if t.is_alive()}
        free = self.max_parallel_tool_calls - len(self._held)
        deadline = time.monotonic() + self.tool_timeout
        lock, stop = threading.Lock(), threading.Event()

        def work() -> None:
            with call_deadline(deadline):
                while not stop.is_set():
                    with lock:
                        if not queue:
                            return
                        i = queue.popleft()
                    results[i] = self._call(calls[i], rows[i] if rows else None)

        threads = [
            threading.Thread(target=work, daemon=True, name=f"verl-tool-{k}")
            for k in range(min(free, len(queue)))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:  # a Ctrl-C of the driver interrupts this wait
            thread.join(max(0.0, deadline - time.monotonic()))
        with lock:
            stop.set()  # calls not started by now never start
            never_started = set(queue)
            queue.clear()
        held = {t for t in threads if t.is_alive()}
        if held:
            logger.warning(
                "%d tool call(s) ran past multi_turn.tool_timeout=%gs; their threads stay "
                "until the calls return (%d of max_parallel_tool_calls=%d held)",
                len(held),
                self.tool_timeout,
                len(held | self._held),
                self.max_parallel_tool_calls,
            )
        self._held |= held
        out = []
        for i, (call, result) in enumerate(zip(calls, results)):
            if result is None and i in never_started:
                why = (
                    f"all {self.max_parallel_tool_calls} tool threads are held by calls that "
                    "timed out earlier"
                    if not threads
                    else f"at most {self.max_parallel_tool_calls} calls run at once"
                )
                result = _ToolResult(
                    f"Error: tool {call.name!r} did not start within {self.tool_timeout:g} s "
                    f"({why})",
                    error=True,
                    timed_out=True,
                )
            elif result is None:
                result = self._timed_out(call)
            out.append(result)
        return out

    # ------------------------------------------------------------------ output
    def _assemble(
        self,
        prompts: Any,
        params: SamplingParams,
        samples: list[_Sample],
        position_ids: torch.Tensor,
    ) -> Any:
        rows, width = len(samples), params.max_new_tokens
        pad = getattr(getattr(self.generator, "engine", None), "pad_token_id", None)
        if pad is None:
            pad = self.tokenizer.pad_token_id or 0
        responses = torch.full((rows, width), int(pad), dtype=torch.long)
        response_mask = torch.zeros((rows, width), dtype=torch.long)
        real = torch.zeros((rows, width), dtype=torch.long)
        log_probs = torch.zeros((rows, width), dtype=torch.float32)
        for r, s in enumerate(samples):
            n = len(s.ids)
            responses[r, :n] = torch.tensor(s.ids, dtype=torch.long)
            response_mask[r, :n] = torch.tensor(s.mask, dtype=torch.long)
            real[r, :n] = 1
            log_probs[r, :n] = torch.tensor(s.log_probs, dtype=torch.float32)
        out = assemble_rollout_output(
            prompts, params, responses, response_mask, log_probs, position_ids=position_ids
        )
        attention = out.batch["attention_mask"]
        attention[:, -width:] = real.to(attention.dtype)
        versions = trajectory_versions(samples, width)
        if versions is not None:
            out.batch[TOKEN_VERSIONS] = versions.to(attention.device)
        columns = {
            "messages": [s.messages for s in samples],
            "num_turns": [s.turns for s in samples],
            "num_tool_calls": [s.tool_calls for s in samples],
            "num_tool_errors": [s.tool_errors for s in samples],
            "num_tool_parse_errors": [s.tool_parse_errors for s in samples],
            "num_tool_timeouts": [s.tool_timeouts for s in samples],
            "num_interaction_turns": [s.interaction_turns for s in samples],
            "turn_info": [s.turn_info for s in samples],
        }
        for key, values in columns.items():
            column = np.empty(rows, dtype=object)  # element-wise: a list stays one object
            for r, value in enumerate(values):
                column[r] = value
            out.non_tensor_batch[key] = column
        return out


def multi_turn_metrics(non_tensor: Any) -> dict[str, float]:
    """``multi_turn/*`` metrics of a batch from the agent loop (empty for other batches)."""
    if "num_turns" not in non_tensor:
        return {}
    turns = np.asarray(non_tensor["num_turns"], dtype=np.float64)
    calls = np.asarray(non_tensor["num_tool_calls"], dtype=np.float64)
    errors = np.asarray(non_tensor["num_tool_errors"], dtype=np.float64)
    parse_errors = np.asarray(non_tensor.get("num_tool_parse_errors", [0]), dtype=np.float64)
    timeouts = np.asarray(non_tensor["num_tool_timeouts"], dtype=np.float64)
    replies = np.asarray(non_tensor.get("num_interaction_turns", [0]), dtype=np.float64)
    return {
        "multi_turn/turns_mean": float(turns.mean()),
        "multi_turn/turns_max": float(turns.max()),
        "multi_turn/tool_calls": float(calls.sum()),
        "multi_turn/tool_calls_mean": float(calls.mean()),
        "multi_turn/tool_errors": float(errors.sum()),
        "multi_turn/tool_parse_errors": float(parse_errors.sum()),
        "multi_turn/tool_timeouts": float(timeouts.sum()),
        "multi_turn/interaction_turns": float(replies.sum()),
        "multi_turn/interaction_turns_mean": float(replies.mean()),
    }


def _prompt_messages(non_tensor: Any, row: int) -> list[dict[str, Any]]:
    """The prompt's chat messages (``raw_prompt``; a text is one user turn), or []."""
    if "raw_prompt" not in non_tensor:
        return []
    raw = non_tensor["raw_prompt"][row]
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    return [dict(m) for m in raw]

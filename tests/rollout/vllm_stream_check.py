"""Groups streamed out of a real vLLM engine as its requests finish; prints one JSON line.

Run in a subprocess by ``tests/rollout/test_vllm_stream.py`` (vLLM's process-wide side
effects stay out of pytest):

    python tests/rollout/vllm_stream_check.py

A tiny Qwen2 (head size 64, which vLLM's CPU attention supports; weights scaled up for
varied greedy outputs), fp32. Greedy decoding first finds stop tokens that end every prompt
but the first within 3 tokens while the first never meets one: one request is much longer
than the others. The streaming call then records, for each group handed to the sink, its
arrival time, the engine steps run so far and the requests still unfinished; and its output
is compared with the plain call's. Sampled (n=2) calls compare layout and values of the
plain output, the streamed output and the streamed groups, from the same torch seed (vLLM
on CPU draws from the process's torch generator). Then a sink that raises: the call's
other requests are aborted and the engine stays usable. Last, a second engine in the
process takes weight pushes in a loop on another thread while the first streams (as the
actor's engine does beside the asynchronous rollout copy's): both take the process-wide
vLLM lock, the pushes land between steps and the output is unchanged.
"""

from __future__ import annotations

import json
import threading
import time

import torch

from tests.rollout.conftest import make_batch
from verl.models.tiny import build_tiny_model, build_tiny_tokenizer
from verl.protocol import DataProto
from verl.rollout import SamplingParams
from verl.rollout.vllm_rollout import VLLMRollout
from verl.rollout.vllm_stream import generate_streaming

PROMPTS = ["1+2=", "hello", "what is 3*4", "7-5=", "the sum of 8 and 9 is", "2*2="]
LONG = 96  # max_new_tokens: the long request's length


def build() -> tuple[VLLMRollout, DataProto, torch.nn.Module]:
    tok = build_tiny_tokenizer()
    tok.padding_side = "left"
    model = build_tiny_model(
        arch="qwen2",
        tokenizer=tok,
        hidden_size=256,
        num_layers=2,
        intermediate_size=512,
        num_heads=4,
        num_kv_heads=2,
        seed=0,
    )
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    rollout = VLLMRollout(
        model.eval(), tok, pad_token_id=tok.pad_token_id, max_model_len=256, seed=0
    )
    return rollout, make_batch(tok, PROMPTS), model


def same(a: DataProto, b: DataProto) -> bool:
    return set(a.batch.keys()) == set(b.batch.keys()) and all(
        torch.equal(a.batch[k], b.batch[k]) for k in a.batch
    )


def main() -> None:
    rollout, prompts, model = build()
    engine = rollout.llm.llm_engine

    # stop tokens: the short prompts' first 3 greedy tokens that the long one never emits
    free = rollout.generate(prompts, SamplingParams(do_sample=False, max_new_tokens=LONG))
    responses = free.batch["responses"].tolist()
    long_tokens = set(responses[0])
    stops = sorted({t for r in responses[1:] for t in r[:3]} - long_tokens)
    greedy = SamplingParams(do_sample=False, max_new_tokens=LONG, stop_token_ids=stops)
    plain = rollout.generate(prompts, greedy)

    steps = 0
    step = engine.step

    def counted_step():
        nonlocal steps
        steps += 1
        return step()

    engine.step = counted_step
    arrivals = []
    start = time.perf_counter()

    def sink(prompt: int, group: DataProto, params: SamplingParams) -> None:
        arrivals.append(
            {
                "prompt": prompt,
                "seconds": time.perf_counter() - start,
                "steps": steps,
                "unfinished": engine.get_num_unfinished_requests(),
                "length": int(group.batch["response_mask"].sum()),
                "rows": len(group),
            }
        )

    streamed = generate_streaming(rollout, prompts, greedy, sink)
    call_seconds, call_steps = time.perf_counter() - start, steps
    engine.step = step

    # sampled, n=2: plain vs streamed from the same torch seed, and the groups
    sampled = SamplingParams(n=2, max_new_tokens=24, stop_token_ids=stops)
    torch.manual_seed(3)
    plain_n = rollout.generate(prompts, sampled)
    groups: dict[int, DataProto] = {}
    torch.manual_seed(3)
    streamed_n = generate_streaming(
        rollout, prompts, sampled, lambda i, g, p: groups.__setitem__(i, g)
    )
    joined = DataProto.concat([groups[i] for i in range(len(PROMPTS))])

    # a sink that raises: the other requests (n samples each) are aborted, the engine stays
    # usable
    running_at_failure = []

    def failing(prompt: int, group: DataProto, params: SamplingParams) -> None:
        running_at_failure.append(engine.get_num_unfinished_requests())
        raise KeyError("sink failed")

    try:
        generate_streaming(rollout, prompts, sampled, failing)
        raised = ""
    except KeyError as exc:
        raised = str(exc)
    idle_after_failure = not engine.has_unfinished_requests()
    again = rollout.generate(prompts, greedy)

    # another engine of the process takes pushes while this one streams
    other = VLLMRollout(
        model, rollout.tokenizer, pad_token_id=rollout.pad_token_id, max_model_len=256, seed=0
    )
    stop, pushes = threading.Event(), []

    def push_loop() -> None:
        while not stop.is_set():
            other.update_weights(model.state_dict().items())
            pushes.append(time.perf_counter())

    pusher = threading.Thread(target=push_loop)
    pusher.start()
    try:
        begin = time.perf_counter()
        concurrent = generate_streaming(rollout, prompts, greedy, lambda *a: None)
        finish = time.perf_counter()
    finally:
        stop.set()
        pusher.join()
    other.close()

    print(
        json.dumps(
            {
                "stops": len(stops),
                "plain_lengths": plain.batch["response_mask"].sum(1).tolist(),
                "arrivals": arrivals,
                "call_seconds": call_seconds,
                "call_steps": call_steps,
                "streamed_equals_plain": same(streamed, plain),
                "sampled_streamed_equals_plain": same(streamed_n, plain_n),
                "sampled_groups_equal_plain": same(joined, plain_n),
                "sampled_rows": len(plain_n),
                "sampled_group_rows": [len(groups[i]) for i in range(len(PROMPTS))],
                "sampled_group_keys": sorted(groups[0].batch.keys()),
                "plain_keys": sorted(plain_n.batch.keys()),
                "sampled_distinct_rows": len(
                    {tuple(r) for r in plain_n.batch["responses"].tolist()}
                ),
                "raised": raised,
                "unfinished_at_failure": running_at_failure,
                "idle_after_failure": idle_after_failure,
                "usable_after_failure": same(again, plain),
                "pushes_during_call": sum(begin < t < finish for t in pushes),
                "same_with_pushes_alongside": same(concurrent, plain),
            }
        )
    )
    rollout.close()


if __name__ == "__main__":
    main()

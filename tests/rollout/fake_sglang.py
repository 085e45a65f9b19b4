"""A stand-in for ``sglang.Engine`` (SGLang 0.5.x) that runs on CPU, for the adapter's tests.

It has SGLang's interface: the constructor takes ``ServerArgs`` field names as keywords (and
refuses others, as ``ServerArgs(**kwargs)`` does); ``generate`` has SGLang's argument names
and returns one dict per request with ``text`` and ``meta_info`` (``id``, ``finish_reason``,
``prompt_tokens``, ``completion_tokens``, ``output_token_logprobs`` as
``(logprob, token_id, text)``), the dict itself for a single request; the sampling
parameters are a dict of SGLang's ``SamplingParams`` names (others refused); weights arrive by
``update_weights_from_tensor(named_tensors, load_format, flush_cache)``; memory by
``release_memory_occupation(tags)`` / ``resume_memory_occupation(tags)``; ``flush_cache`` and
``shutdown`` as SGLang's. Stop rules are SGLang's: ``stop_token_ids`` plus the tokenizer's eos,
both off with ``ignore_eos``.

Inside, it keeps its own copy of the model (random weights at start, as ``load_format="dummy"``)
and samples with verl's native engine, so a missed weight push shows as stale outputs.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, ClassVar

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from verl.protocol import DataProto
from verl.rollout import SamplingParams
from verl.rollout.native import NativeRollout

SERVER_ARGS = {
    "model_path",
    "tokenizer_path",
    "dtype",
    "load_format",
    "context_length",
    "mem_fraction_static",
    "tp_size",
    "random_seed",
    "enable_memory_saver",
    "log_level",
    "trust_remote_code",
    "skip_tokenizer_init",
}
SAMPLING_KEYS = {
    "max_new_tokens",
    "min_new_tokens",
    "stop",
    "stop_token_ids",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "custom_params",
    "sampling_seed",
}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class FakeSGLangEngine:
    """``sglang.Engine`` on CPU (see the module docstring). ``instances``: every one made."""

    instances: ClassVar[list[FakeSGLangEngine]] = []

    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - SERVER_ARGS
        if unknown:
            raise TypeError(f"ServerArgs.__init__() got unexpected keyword arguments {unknown}")
        self.server_args = kwargs
        config = AutoConfig.from_pretrained(kwargs["model_path"])
        assert kwargs.get("load_format") == "dummy"
        torch.manual_seed(1234)  # dummy weights: random, unlike the trainer's
        self.model = AutoModelForCausalLM.from_config(
            config, torch_dtype=_DTYPES[kwargs.get("dtype", "float32")]
        ).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(kwargs["tokenizer_path"])
        self.sampler = NativeRollout(self.model, self.tokenizer)
        self.released: set[str] = set()
        self.calls: list[tuple[str, Any]] = []  # (method, what it was given)
        self.stall = threading.Event()  # set: update_weights_from_tensor blocks until cleared
        self.shut_down = False
        FakeSGLangEngine.instances.append(self)

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompt: Any = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[list[int]] | list[int] | None = None,
        image_data: Any = None,
        return_logprob: bool | list[bool] = False,
        logprob_start_len: Any = None,
        top_logprobs_num: Any = None,
        token_ids_logprob: Any = None,
        lora_path: Any = None,
        custom_logit_processor: Any = None,
        return_hidden_states: bool = False,
        stream: bool = False,
        **rest: Any,
    ) -> dict | list[dict]:
        assert not self.shut_down, "generate after shutdown"
        if "kv_cache" in self.released:
            raise RuntimeError("generate while the KV cache is released")
        assert prompt is None and input_ids is not None and not stream
        single = bool(input_ids) and isinstance(input_ids[0], int)
        batch = [input_ids] if single else list(input_ids)
        sp = dict(sampling_params or {})
        unknown = set(sp) - SAMPLING_KEYS
        if unknown:
            raise TypeError(f"SamplingParams.__init__() got unexpected keyword arguments {unknown}")
        self.calls.append(("generate", {"input_ids": batch, "sampling_params": sp}))
        outputs = [self._one(ids, sp, bool(return_logprob)) for ids in batch]
        return outputs[0] if single else outputs

    def _one(self, ids: list[int], sp: dict, return_logprob: bool) -> dict:
        temperature = float(sp.get("temperature", 1.0))
        stops = [] if sp.get("ignore_eos") else list(sp.get("stop_token_ids") or [])
        if not sp.get("ignore_eos") and self.tokenizer.eos_token_id is not None:
            stops.append(self.tokenizer.eos_token_id)
        params = SamplingParams(
            n=int(sp.get("n", 1)),
            temperature=temperature if temperature > 0 else 1.0,
            do_sample=temperature > 0,
            top_p=float(sp.get("top_p", 1.0)),
            top_k=int(sp.get("top_k", -1)),
            max_new_tokens=int(sp["max_new_tokens"]),
            stop_token_ids=stops,
            stop_strings=list(sp.get("stop") or []),
        )
        x = torch.tensor([ids])
        prompts = DataProto.from_dict(
            tensors={
                "input_ids": x,
                "attention_mask": torch.ones_like(x),
                "position_ids": torch.arange(x.shape[1]).unsqueeze(0),
            }
        )
        out = self.sampler.generate(prompts, params)
        length = int(out.batch["response_mask"][0].sum())
        tokens = out.batch["responses"][0, :length].tolist()
        logps = out.batch["rollout_log_probs"][0, :length].tolist()
        finish = (
            {"type": "stop", "matched": tokens[-1]}
            if tokens and tokens[-1] in stops
            else {"type": "length", "length": length}
        )
        meta = {
            "id": uuid.uuid4().hex,
            "finish_reason": finish,
            "prompt_tokens": len(ids),
            "completion_tokens": length,
            "cached_tokens": 0,
        }
        if return_logprob:
            meta["output_token_logprobs"] = [(lp, tok, None) for lp, tok in zip(logps, tokens)]
        return {"text": self.tokenizer.decode(tokens), "meta_info": meta}

    # ------------------------------------------------------------------ weights and memory
    def update_weights_from_tensor(
        self,
        named_tensors: list[tuple[str, torch.Tensor]],
        load_format: str | None = None,
        flush_cache: bool = True,
    ) -> tuple[bool, str]:
        while self.stall.is_set():  # a stalled engine: blocks until the test clears it
            time.sleep(0.05)
        names = [name for name, _ in named_tensors]
        dtypes = {tensor.dtype for _, tensor in named_tensors}
        self.calls.append(
            ("update_weights_from_tensor", {"names": names, "flush": flush_cache, "dtypes": dtypes})
        )
        state = {name: tensor for name, tensor in named_tensors}
        missing = self.model.load_state_dict(state, strict=False).unexpected_keys
        assert not missing, f"unknown weights {missing}"
        return True, "Succeeded to update model weights."

    def flush_cache(self) -> None:
        self.calls.append(("flush_cache", None))

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.calls.append(("release_memory_occupation", tags))
        self.released |= set(tags or ["kv_cache", "weights"])

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.calls.append(("resume_memory_occupation", tags))
        self.released -= set(tags or ["kv_cache", "weights"])

    def shutdown(self) -> None:
        self.calls.append(("shutdown", None))
        self.shut_down = True

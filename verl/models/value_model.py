"""Critic and reward models.

`CausalLMWithValueHead` is the PPO critic: the transformer body of a HF causal LM (its
`base_model`, e.g. `LlamaModel`, without the LM head, so no vocabulary-sized logits are ever
computed) plus a linear value head `hidden_size -> 1` that predicts one value per token.

Value-head init: weight ~ N(0, 1e-3), bias 0, from a fixed seed. Initial values are then
close to 0 (about 1e-3 * sqrt(hidden_size), since the final RMSNorm output has unit-scale
components), so early advantages are not dominated by an arbitrary baseline, while the weight
is non-zero so the value loss reaches the backbone from the first step.

On disk a critic is an ordinary HF base-model directory (`config.json` + safetensors, loadable
with `AutoModel`) plus `value_head.safetensors`. `from_pretrained` accepts either such a
directory or a plain causal-LM directory (the head is then freshly initialised).

`load_reward_model` loads a local sequence-classification reward model.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedModel

from verl.models.loading import (
    check_model_dir,
    config_with_overrides,
    load_tokenizer,
    resolve_model_path,
    set_hub_offline,
)
from verl.models.precision import hf_checkpointing_enable, resolve_dtype

logger = logging.getLogger(__name__)

VALUE_HEAD_FILENAME = "value_head.safetensors"
VALUE_HEAD_INIT_STD = 1e-3


class CausalLMWithValueHead(nn.Module):
    """Transformer body + scalar value head; `forward` returns values `(batch, seq_len)` fp32.

    Attributes: `model` (the HF base model, whose `.layers` an engine may shard or
    checkpoint), `value_head` (`nn.Linear(hidden_size, 1)`), `config` (the HF config).
    """

    def __init__(self, backbone: PreTrainedModel, init_seed: int = 0):
        super().__init__()
        # `base_model` is the body for a *ForCausalLM and the model itself for a base model.
        self.model = backbone.base_model
        self.config = self.model.config
        hidden = self.config.hidden_size
        self.value_head = nn.Linear(hidden, 1, dtype=torch.float32)
        gen = torch.Generator().manual_seed(init_seed)
        with torch.no_grad():
            self.value_head.weight.copy_(
                torch.randn(1, hidden, generator=gen) * VALUE_HEAD_INIT_STD
            )
            self.value_head.bias.zero_()

    @property
    def _no_split_modules(self) -> list[str]:
        return list(getattr(self.model, "_no_split_modules", None) or [])

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **model_kwargs: Any,
    ) -> torch.Tensor:
        """Values for every position.

        input_ids, attention_mask, position_ids: (batch, seq_len); ``model_kwargs`` go to the
        HF body (e.g. a packed batch's block-attention plan). Returns (batch, seq_len)
        float32; the value at position t estimates the return from the state ending at token t.
        """
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            **model_kwargs,
        )
        hidden = out.last_hidden_state
        w, b = self.value_head.weight, self.value_head.bias
        # The head runs in fp32 even under a bf16 body: it is tiny and values need precision.
        return F.linear(hidden.float(), w.float(), b.float()).squeeze(-1)

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs: dict | None = None):
        """Checkpoint the HF body's decoder layers (used by `enable_activation_checkpointing`)."""
        hf_checkpointing_enable(self.model, activation_checkpointing_kwargs)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        dtype: torch.dtype | str = torch.float32,
        trust_remote_code: bool = False,
        attn_implementation: str | None = None,
        init_seed: int = 0,
        override_config: Mapping[str, Any] | None = None,
    ) -> CausalLMWithValueHead:
        """Load from a local causal-LM dir (new head) or a saved critic dir (saved head).

        The body is loaded in `dtype`; the value head stays float32. `override_config` sets
        fields of the body's HF config (see `verl.models.loading.config_with_overrides`).
        """
        from transformers import AutoModel, AutoModelForCausalLM

        set_hub_offline()
        model_dir = resolve_model_path(path)
        gguf = check_model_dir(model_dir)
        head_file = model_dir / VALUE_HEAD_FILENAME
        # A saved critic is a base-model dir; a causal-LM dir is loaded whole (its LM head is
        # dropped below), which loads every key it has and keeps transformers' report quiet.
        auto_cls = AutoModel if head_file.is_file() else AutoModelForCausalLM
        kwargs = {"gguf_file": gguf} if gguf else {}
        if attn_implementation is not None:
            kwargs["attn_implementation"] = attn_implementation
        config = config_with_overrides(
            model_dir,
            override_config,
            gguf=gguf,
            trust_remote_code=trust_remote_code,
            what="critic.model.override_config",
        )
        if config is not None:
            kwargs["config"] = config
        body = auto_cls.from_pretrained(
            model_dir,
            dtype=resolve_dtype(dtype),
            trust_remote_code=trust_remote_code,
            local_files_only=True,
            **kwargs,
        )
        if gguf:
            body.hf_quantizer = None
            if hasattr(body.config, "quantization_config"):
                del body.config.quantization_config
        critic = cls(body, init_seed=init_seed)
        if head_file.is_file():
            state = load_file(head_file)
            critic.value_head.load_state_dict(
                {k: v.to(torch.float32) for k, v in state.items()}, strict=True
            )
            logger.info("loaded critic with its saved value head from %s", model_dir)
        else:
            logger.info("loaded critic body from %s with a new value head", model_dir)
        return critic

    def save_pretrained(self, save_dir: str | os.PathLike) -> Path:
        """Write the body as a HF directory plus `value_head.safetensors`; return the dir."""
        save_dir = Path(save_dir)
        save_dir.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(save_dir)
        save_value_head(self.value_head.state_dict(), save_dir)
        return save_dir


def split_critic_state(
    state: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A critic's full state dict as ``(body, head)``: the HF body's weights (``model.``
    stripped: what the body's ``save_pretrained`` takes) and the value head's
    (``value_head.`` stripped)."""
    body = {k[len("model.") :]: v for k, v in state.items() if k.startswith("model.")}
    head = {k[len("value_head.") :]: v for k, v in state.items() if k.startswith("value_head.")}
    return body, head


def save_value_head(head: Mapping[str, torch.Tensor], save_dir: str | os.PathLike) -> None:
    """Write the value head's weights as ``value_head.safetensors`` in ``save_dir`` (what
    :meth:`CausalLMWithValueHead.from_pretrained` loads beside the body)."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in head.items()}
    save_file(tensors, Path(save_dir) / VALUE_HEAD_FILENAME, metadata={"format": "pt"})


def load_reward_model(
    path: str | os.PathLike,
    dtype: torch.dtype | str = torch.float32,
    trust_remote_code: bool = False,
    override_config: Mapping[str, Any] | None = None,
) -> PreTrainedModel:
    """Load a local `AutoModelForSequenceClassification` reward model in eval mode.

    A batch needs `config.pad_token_id` to find each sequence's last token; when the config
    lacks it, it is taken from the directory's tokenizer.
    """
    from transformers import AutoModelForSequenceClassification

    set_hub_offline()
    model_dir = resolve_model_path(path)
    check_model_dir(model_dir)
    config = config_with_overrides(
        model_dir,
        override_config,
        trust_remote_code=trust_remote_code,
        what="reward_model.model.override_config",
    )
    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir,
        dtype=resolve_dtype(dtype),
        trust_remote_code=trust_remote_code,
        local_files_only=True,
        **({"config": config} if config is not None else {}),
    )
    if model.config.num_labels != 1:
        logger.warning(
            "reward model %s has num_labels=%d; a scalar reward expects 1",
            model_dir,
            model.config.num_labels,
        )
    if model.config.pad_token_id is None:
        model.config.pad_token_id = load_tokenizer(model_dir).pad_token_id
    return model.eval()

"""Prompt datasets for RL: reading and validating verl-format files, tokenizing, left-padded
collation into `DataProto`, resumable batching, and generators / converters for arithmetic
and GSM8K data; SFT samples with assistant-only loss masks and packing (`sft_dataset`), and
preference pairs / KTO rows for DPO, IPO and KTO (`preference_dataset`).

Names are imported lazily so that `python -m verl.data.arithmetic` does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from verl.utils.lazy import lazy_exports

if TYPE_CHECKING:
    from verl.data.arithmetic import make_arithmetic_rows, write_arithmetic_dataset
    from verl.data.gsm8k import convert_gsm8k, extract_gsm8k_answer
    from verl.data.io import DatasetValidationError, read_records, write_records
    from verl.data.lazy_dataset import LazyRLHFDataset
    from verl.data.preference_dataset import PreferenceDataset, collate_preference
    from verl.data.rl_dataset import RLHFDataset, collate_fn, collate_prompts, validate_row
    from verl.data.sampler import PromptDataLoader, ResumableBatchSampler
    from verl.data.sft_dataset import (
        PackedSFTDataset,
        SFTDataset,
        collate_sft,
        tokenize_conversation,
    )

_LAZY = {
    "RLHFDataset": "verl.data.rl_dataset",
    "LazyRLHFDataset": "verl.data.lazy_dataset",
    "collate_fn": "verl.data.rl_dataset",
    "collate_prompts": "verl.data.rl_dataset",
    "validate_row": "verl.data.rl_dataset",
    "DatasetValidationError": "verl.data.io",
    "read_records": "verl.data.io",
    "write_records": "verl.data.io",
    "PromptDataLoader": "verl.data.sampler",
    "ResumableBatchSampler": "verl.data.sampler",
    "make_arithmetic_rows": "verl.data.arithmetic",
    "write_arithmetic_dataset": "verl.data.arithmetic",
    "convert_gsm8k": "verl.data.gsm8k",
    "extract_gsm8k_answer": "verl.data.gsm8k",
    "SFTDataset": "verl.data.sft_dataset",
    "PackedSFTDataset": "verl.data.sft_dataset",
    "collate_sft": "verl.data.sft_dataset",
    "tokenize_conversation": "verl.data.sft_dataset",
    "PreferenceDataset": "verl.data.preference_dataset",
    "collate_preference": "verl.data.preference_dataset",
}

__all__ = [
    "DatasetValidationError",
    "LazyRLHFDataset",
    "PackedSFTDataset",
    "PreferenceDataset",
    "PromptDataLoader",
    "RLHFDataset",
    "ResumableBatchSampler",
    "SFTDataset",
    "collate_fn",
    "collate_preference",
    "collate_prompts",
    "collate_sft",
    "convert_gsm8k",
    "extract_gsm8k_answer",
    "make_arithmetic_rows",
    "read_records",
    "tokenize_conversation",
    "validate_row",
    "write_arithmetic_dataset",
    "write_records",
]


__getattr__ = lazy_exports(__name__, _LAZY)

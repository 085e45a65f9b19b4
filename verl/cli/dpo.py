"""Entry point of preference optimisation: ``python -m verl.trainer.main_dpo [--config FILE] key=value ...``

DPO, IPO or KTO (``algorithm.loss_type``) on preference data. The config (defaults
``verl/trainer/config/dpo_trainer.yaml`` + FILE + dotted overrides) is validated before
torch is imported; a config error exits with code 2. Then ``DPOTrainer`` runs and the final
model is written as a HuggingFace directory.

    python -m verl.trainer.main_dpo                                   # built-in arithmetic pairs
    python -m verl.trainer.main_dpo data.train_files=pairs.jsonl algorithm.beta=0.2
    python -m verl.trainer.main_dpo algorithm.loss_type=kto data.train_files=kto.jsonl
"""

from __future__ import annotations

import sys
from typing import Any

from verl.cli.sft import run_offline
from verl.config import DPOConfig, load_dpo_config


def run_dpo(cfg: DPOConfig) -> dict[str, Any]:
    """Train on a validated config (imports torch and transformers); returns the results."""
    import transformers

    from verl.trainer.offline.launch import train_offline

    transformers.utils.logging.disable_progress_bar()
    return train_offline("dpo", cfg)


def main(argv: list[str] | None = None, prog: str = "python -m verl.trainer.main_dpo") -> int:
    """Command-line entry; returns the exit code (0 ok, 2 bad config)."""
    return run_offline(
        argv,
        kind="dpo",
        prog=prog,
        description="DPO / IPO / KTO on preference data. See docs/sft_dpo.md.",
        load=load_dpo_config,
        run=run_dpo,
    )


if __name__ == "__main__":
    sys.exit(main())

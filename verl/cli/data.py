"""``verl data``: list or run the built-in dataset generators and converters.

    verl data list
    verl data arithmetic --out data/arith --train-size 1000 --val-size 200
    verl data gsm8k --input gsm8k/train.jsonl --out data/gsm8k/train.parquet

Each tool writes prompt datasets in verl's format (``data_source``, ``prompt`` messages,
``reward_model.ground_truth``, ``extra_info``: README "Data"), readable by
``data.train_files`` / ``data.val_files``, ``verl generate`` and ``verl eval``. A tool is
its module's ``main``; ``verl data TOOL --help`` lists its options.
"""

from __future__ import annotations

import importlib
import sys

# tool -> (module with main(argv, prog=...), kind, what it does)
TOOLS: dict[str, tuple[str, str, str]] = {
    "arithmetic": (
        "verl.data.arithmetic",
        "generator",
        "verifiable a+b / a-b / a*b problems (digits, ops, sizes, seed) -> train/test files",
    ),
    "gsm8k": (
        "verl.data.gsm8k",
        "converter",
        "GSM8K .jsonl (question, answer) -> verl format with the final number as ground truth",
    ),
}


def usage(prog: str) -> str:
    lines = [f"usage: {prog} list | {prog} TOOL [options]", "", "tools:"]
    lines += [f"  {name:<11} {kind:<9}  {text}" for name, (_, kind, text) in TOOLS.items()]
    lines += ["", f"`{prog} TOOL --help` lists the options of one tool (docs/cli.md)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None, prog: str = "verl data") -> int:
    """Run ``list`` or a tool; returns its exit code (2 for an unknown tool)."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "list"):
        sys.stdout.write(usage(prog))
        return 0 if args else 2
    tool, rest = args[0], args[1:]
    if tool not in TOOLS:
        sys.stderr.write(f"{prog}: unknown tool {tool!r}; choose from {sorted(TOOLS)}\n")
        return 2
    module = importlib.import_module(TOOLS[tool][0])
    return module.main(rest, prog=f"{prog} {tool}")


if __name__ == "__main__":
    sys.exit(main(prog="python -m verl.cli.data"))

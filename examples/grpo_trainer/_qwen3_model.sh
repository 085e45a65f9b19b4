# Sourced by the Qwen3-0.6B scripts of this directory: checks that MODEL_PATH names a local
# model directory (Qwen3-0.6B is not shipped) and sets $model and $python, or exits 2
# saying what to do.
model="${MODEL_PATH:-}"
if [ -z "$model" ] || [ ! -d "$model" ]; then
    echo "$(basename "$0"): no model directory at MODEL_PATH='$model'. Qwen3-0.6B is not" \
        "shipped with verl: download it (huggingface-cli download Qwen/Qwen3-0.6B" \
        "--local-dir DIR) and set MODEL_PATH=DIR, or run the embedded SmolLM2 example" \
        "instead: bash scripts/run.sh (or examples/grpo_trainer/run_smollm2_arith.sh)" >&2
    exit 2
fi
python="${PYTHON:-python3}"

"""Kernels: the tensor code of attention and log-probs that the engines, workers and rollout
engines share.

- :mod:`verl.kernels.torch_functional`: log-probs and entropies of response tokens, chunked
  over the LM head (:func:`~verl.kernels.torch_functional.compute_response_log_probs`).
- :mod:`verl.kernels.logprob_kernels`: the chunked log-prob / entropy autograd kernels over
  a logits tensor.
- :mod:`verl.kernels.packed_model`: a model's forward pass on a packed batch (packing for
  a model, block-attention plan or packed mask, sequence-parallel inputs).
- :mod:`verl.kernels.packing` / :mod:`verl.kernels.prefix_packing`: sequences packed into
  rows without padding, and a group's shared prompt computed once.
- :mod:`verl.kernels.block_attention`: attention over packed rows computed block by block
  (each sequence, or a shared prompt and its responses, attends only its own keys).
- :mod:`verl.kernels.decode_attention`: the rollout's decode step without repeated key heads.
- :mod:`verl.kernels.packed_linear`: bf16 linear layers on oneDNN-packed weights (the native
  rollout under CPU bf16 autocast).
- :mod:`verl.kernels.ulysses`: Ulysses sequence parallelism (tokens split over the
  ``sequence`` ranks, an all-to-all around attention).

Nothing here knows about configs, workers or trainers.
"""

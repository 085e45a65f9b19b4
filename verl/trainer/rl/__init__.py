"""The RL trainer: the single-controller step (``RLTrainer``), where its batches come from
(plain, dynamic sampling, one-step-off async), and how its parts are built and placed."""

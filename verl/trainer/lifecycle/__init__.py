"""The run lifecycle every trainer shares: the driver (lock, signals, resume, validation,
progress, log and checkpoint cadence, divergence, export, close) and its parts: checkpoint
directories, resume, the run lock, stopping, tracking, profiling, the progress bar."""

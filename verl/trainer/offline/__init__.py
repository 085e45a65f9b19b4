"""The offline trainers: SFT, DPO / IPO / KTO and reward models on fixed data, sharing one
skeleton (``verl.trainer.offline.base``) and the run driver."""

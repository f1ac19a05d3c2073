"""Training: routing heads, the SFT / RL / CMA-ES stages and their configs, checkpoints on disk and
the promoted pointer format. `pointer` and the checkpoint manifest load without torch; the rest
imports it."""

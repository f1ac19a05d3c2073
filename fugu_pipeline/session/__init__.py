"""Multi-turn sessions (TinyRouter): the loop over any policy, the roles and their prompts, verdicts,
the committed answer, the transcript featurizer, the trajectory store. Plain Python: numpy, and
torch only through the encoder a featurizer is given."""

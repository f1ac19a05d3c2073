"""The pipeline's steps: what each trained artefact and each report is made by, in plain Python.

The Dagster assets (`defs/`) and the command line (`fugu-lite train`, `train-sft`, `train-rl`,
`train-es`) call these same functions with the same settings, so the order of the stages, each
stage's defaults and the way a config file is found are written once, here.

Every step is idempotent and content-addressed (`records.py`): it first computes the fingerprint of
its inputs (the reward matrix's data version, the encoder's fingerprint, the warm start's content
hash, the resolved config, its own code version) and, when a record of that fingerprint exists and
its outputs are still on disk, returns them without training or evaluating again.

Plain Python: no `dagster` import; torch loads inside the functions that need it.
"""

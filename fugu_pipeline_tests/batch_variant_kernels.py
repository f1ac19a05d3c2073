"""A pytest plugin: the whole run on kernels whose last bits depend on the batch shape, as an Intel
Xeon's AMX kernels' do (`fugu_pipeline/testing/batch_variant_kernels.py`), on any CPU:

    pytest -p fugu_pipeline_tests.batch_variant_kernels fugu_pipeline_tests/test_encoder.py
"""

from __future__ import annotations

import pytest

from fugu_pipeline.testing.batch_variant_kernels import batch_variant_kernels


@pytest.fixture(autouse=True)
def _batch_variant_kernels_everywhere():  # active only when this module is loaded as a plugin (-p)
    with batch_variant_kernels():
        yield

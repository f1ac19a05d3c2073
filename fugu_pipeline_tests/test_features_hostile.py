"""Hostile cache contents: a foreign shard or a damaged meta.json gives a skip or a one-line error."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from safetensors.numpy import save

from fugu_pipeline.features.cache import EmbeddingCache
from fugu_pipeline.hashing import sha256_text


def _shard(key: str, vectors: np.ndarray) -> bytes:
    keys = np.frombuffer(bytes.fromhex(key), np.uint8).reshape(1, 32)
    return save({"keys": keys, "vectors": vectors})


@pytest.mark.parametrize("vectors", [np.ones((1, 8), np.float32), np.ones((1, 4), np.float16),
                                     np.ones((0, 4), np.float32)])
def test_shard_with_wrong_shape_or_dtype_is_skipped(tmp_path, vectors):
    cache = EmbeddingCache(tmp_path, "fp")
    good = sha256_text("hello")
    cache.put_many([good], np.ones((1, 4), np.float32))
    other = sha256_text("other")
    (tmp_path / "fp" / "0000-foreign.safetensors").write_bytes(_shard(other, vectors))
    with pytest.warns(UserWarning, match="0000-foreign"):
        found, got = EmbeddingCache(tmp_path, "fp").get_many([good, other])
    assert found.tolist() == [True, False]
    assert got.shape == (2, 4) and got[0].tolist() == [1.0] * 4


@pytest.mark.parametrize(("meta", "says"), [(b'{"dim": 4, "fing', "is not valid JSON"), (b'[4]', "has no positive integer 'dim'"),
                                           (b'{"dim": "4"}', "has no positive integer 'dim'"), (b'{"dim": 0}', "has no positive integer 'dim'")])
def test_meta_json_not_json_is_one_line_error(tmp_path, meta, says):
    cache = EmbeddingCache(tmp_path, "fp")
    cache.put_many([sha256_text("a")], np.ones((1, 4), np.float32))
    (tmp_path / "fp" / "meta.json").write_bytes(meta)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the meta is the fault: no shard is blamed for it first
        with pytest.raises(ValueError, match=rf"meta\.json {says}.*delete"):
            EmbeddingCache(tmp_path, "fp").get_many([sha256_text("a")])

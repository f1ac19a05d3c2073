"""A malformed entry in the OpenRouter catalog is left out with a note (in the snapshot and on
`fugu-lite list-models`), so one bad entry does not block the catalog. Loopback only."""

import pytest

from fugu_pipeline.cli.main import main as cli_main
from fugu_pipeline.testing.stub_llm import StubLLMServer
from fugu_pipeline.workers.catalog import snapshot_from_api

MODEL = "test/model-a"


@pytest.fixture
def stub():
    with StubLLMServer() as s:
        s.add_model(MODEL, prompt=1e-6, completion=2e-6)
        yield s


BAD_ENTRIES = [
    {"id": "bad/pricing", "pricing": ["0.1"]},
    {"id": "bad/context", "pricing": {"prompt": "0.000001"}, "context_length": float("inf")},
    {"id": "bad/params", "pricing": {"prompt": "0.000001"}, "supported_parameters": "tools"},
    {"id": "bad/price-nan", "pricing": {"prompt": "nan", "completion": "inf"}},
]
GOOD = {"id": "a/b", "name": "AB", "pricing": {"prompt": "0.000001", "completion": "0.000002"}, "context_length": 1000}


def test_a_malformed_catalog_entry_is_skipped_with_a_note():
    snap = snapshot_from_api({"data": [*BAD_ENTRIES, GOOD]})
    assert sorted(snap.models) == ["a/b", "bad/price-nan"]
    assert snap.price_per_token("a/b") == (1e-6, 2e-6)
    assert snap.price_per_token("bad/price-nan") is None  # non-finite prices are unknown prices
    assert len(snap.skipped) == 3
    assert all(any(e["id"] in note for note in snap.skipped) for e in BAD_ENTRIES[:3])


def test_list_models_prints_the_good_entries_and_names_the_skipped(stub, capsys):
    stub.catalog["bad/pricing"] = BAD_ENTRIES[0]
    stub.catalog["bad/params"] = BAD_ENTRIES[2]
    assert cli_main(["list-models", "--base-url", stub.openrouter_url]) == 0
    out, err = capsys.readouterr()
    assert MODEL in out and "bad/" not in out
    assert "bad/pricing" in err and "bad/params" in err and "skipped" in err

"""A broken worker YAML fails at load with the field that is wrong."""

import pytest

from fugu_pipeline.workers.config import WorkerConfigError, load_workers_config
from fugu_pipeline_tests.conftest import REPO


def write(tmp_path, text):
    p = tmp_path / "w.yaml"
    p.write_text(text)
    return p


def test_shipped_configs_load():
    cfg = load_workers_config(REPO / "configs" / "workers.mock.yaml")
    assert cfg.worker_ids == ["math-expert", "code-expert", "general-expert"]
    assert load_workers_config(REPO / "configs" / "workers.openrouter.example.yaml").workers[0].kind == "openrouter"


@pytest.mark.parametrize("text, field", [
    ("workers:\n  - {id: a, kind: openrouter}\n", "workers[0].model"),
    ("workers:\n  - {id: a, kind: mock}\n  - {id: b, kind: telepathy}\n", "workers[1]"),
    ("workers:\n  - {id: a, kind: mock, mock: {strengths: {math: 1.5}}}\n", "workers[0].mock': strengths.math must lie in [0, 1]"),
    ("workers:\n  - {id: a, kind: mock}\nreward: {cost_weight: -1}\n", "reward.cost_weight"),
    ("workers: []\n", "workers"),
    ("workers:\n  - {id: a, kind: mock}\n  - {id: a, kind: mock}\n", "duplicate worker id(s): a"),
    ("workers:\n  - {id: 'bad id', kind: mock}\n", "workers[0].id"),
    ("workers:\n  - {id: a, kind: mock, colour: red}\n", "workers[0].colour"),
])
def test_broken_yaml_names_the_field(tmp_path, text, field):
    with pytest.raises(WorkerConfigError) as err:
        load_workers_config(write(tmp_path, text))
    assert field in str(err.value)
    assert str(tmp_path / "w.yaml") in str(err.value)


def test_not_yaml_and_missing(tmp_path):
    with pytest.raises(WorkerConfigError, match="not valid YAML"):
        load_workers_config(write(tmp_path, "workers: [unclosed"))
    with pytest.raises(WorkerConfigError, match="not found"):
        load_workers_config(tmp_path / "nope.yaml")

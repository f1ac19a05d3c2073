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
    # accepted before, then a traceback in the first call (a cost past what a call record holds), every
    # cell failed one by one (an infinite latency), or a run that never ends (an infinite sleep, an
    # infinite deadline, one call per 1e300 minutes)
    ("workers:\n  - {id: a, kind: mock, mock: {cost_usd: .inf}}\n", "workers[0].mock.cost_usd': Input should be a finite"),
    ("workers:\n  - {id: a, kind: mock, mock: {cost_usd: 1.0e+300}}\n", "workers[0].mock.cost_usd': Input should be less"),
    ("workers:\n  - {id: a, kind: mock, mock: {latency_s: .inf}}\n", "workers[0].mock.latency_s"),
    ("workers:\n  - {id: a, kind: mock, mock: {sleep_s: .inf}}\n", "workers[0].mock.sleep_s"),
    ("workers:\n  - {id: a, kind: mock, requests_per_minute: 1.0e-300}\n", "workers[0].requests_per_minute"),
    ("workers:\n  - {id: a, kind: mock}\ntimeout_s: .inf\n", "'timeout_s': Input should be a finite"),
    ("workers:\n  - {id: a, kind: mock}\ncooldown: {max_s: .nan}\n", "cooldown.max_s"),
    ("workers:\n  - {id: a, kind: mock}\nreward: {cost_scale_usd: .inf}\n", "reward.cost_scale_usd"),
    ("workers:\n  - {id: a, kind: openai_compatible, model: m, base_url: 'http://h', price_in_per_mtok: .inf}\n",
     "workers[0].price_in_per_mtok"),
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

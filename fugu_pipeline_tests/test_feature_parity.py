"""Serving sees what training saw: the features `route` and `serve` compute for a
prompt equal the cached ones the head was trained and evaluated on (same dtype, template, prompt
rules, truncation, layers): within the dtype's tolerance on any CPU and bit for bit where its
kernels give a row the same bits in any batch shape, so the held-out routes agree between the
cached path (`evaluate`) and the served path (`Router.route_batch`, the server's micro-batches),
ties to within rounding aside (`features/parity.py`).

The data is built to make disagreement likely if anything differed: prompts of very different
lengths (many cut by `--max-length`), batched together in mixed groups (padding would change a
vector), a template with the domain, two hidden layers, and a long few-shot block per domain that
the prompt rules strip.
"""

import json
import random
import shutil

import numpy as np
import pytest

from fugu_pipeline.cli import main
from fugu_pipeline.features.parity import encoder_batch_invariance
from fugu_pipeline_tests.conftest import REPO
from fugu_pipeline_tests.parity_checks import assert_routes_agree, assert_vector_parity

WORKERS = ["a", "b", "c"]
DOMAINS = ["math", "code", "chat"]
FEW_SHOT = {d: "".join(f"Example {k} for {d}: question {k * 7} has answer {k * 3}.\n" for k in range(8)) for d in DOMAINS}


def rows(n: int = 90) -> list[dict]:
    rng = random.Random(0)
    words = "solve compute integral matrix python list prove derivative train hours value sum".split()
    out = []
    for i in range(n):
        d = DOMAINS[i % 3]
        q = " ".join(rng.choice(words) for _ in range(rng.randint(2, 60)))
        best = (i // 3 + len(q)) % 3
        out.append({"task_id": f"t{i:03d}", "prompt": FEW_SHOT[d] + "Question: " + q, "domain": d,
                    "split": ("train", "train", "val", "test")[i % 4] if i < 80 else "test", "worker_ids": WORKERS,
                    "quality": [1.0 if j == best else 0.0 for j in range(3)],
                    "cost_usd": [0.001 * (j + 1) for j in range(3)], "tags": ["id"]})
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    work = tmp_path_factory.mktemp("parity")
    shutil.copytree(REPO / "configs", work / "configs")
    (work / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows()))
    (work / "w.yaml").write_text("reward:\n  quality_weight: 1.0\n  cost_weight: 0.0\n  latency_weight: 0.0\n")
    (work / "sft.yaml").write_text("head: quality\nepochs: 20\n")
    args = ["--data", str(work / "r.jsonl"), "--workers", str(work / "w.yaml"), "--device", "cpu",
            "--cache-dir", str(work / "emb"), "--work-dir", str(work / "imports")]
    feats = ["--encoder", "tiny", "--template", "{domain}: {prompt}", "--max-length", "24", "--layers", "-1", "1"]
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["train-sft", *args, *feats, "--config", str(work / "sft.yaml"), "--prompt-rules", "on",
                     "--output", str(work / "models")]) == 0
    ckpt = out.getvalue().strip().splitlines()[-1]
    return work, ckpt, args


def cached_held_out(work, ckpt, args):
    """What `evaluate` routes on: the cached features of the held-out rows, read through the cache."""
    from fugu_pipeline.cli.main import build_parser
    from fugu_pipeline.cli.training import encoder_settings, matrix_db
    from fugu_pipeline.features.encoder import LazyEncoder
    from fugu_pipeline.features.routing_data import load_routing_data
    from fugu_pipeline.train.checkpoints import load_checkpoint

    ck = load_checkpoint(ckpt)
    a = build_parser().parse_args(["evaluate", "--checkpoint", ckpt, *args])
    settings = encoder_settings(a, None, ck.manifest.feature_contract)
    data, emb = load_routing_data(matrix_db(a), LazyEncoder(settings), work / "emb")
    assert emb.n_computed == 0, "evaluate must read the features training cached"
    return ck, data.split("test")


def test_every_held_out_route_agrees(trained):
    work, ckpt, args = trained
    from fugu_pipeline.evaluate.reports import head_scores
    from fugu_pipeline.route.router import Router
    from fugu_pipeline.serve.batching import RouteRequest, route_grouped

    ck, held = cached_held_out(work, ckpt, args)
    contract = ck.manifest.feature_contract
    assert contract.prompt_rules is not None and not contract.prompt_rules.is_empty()  # the few-shot block is stripped
    assert contract.max_length == 24 and contract.layer == (-1, 1) and contract.prompt_template == "{domain}: {prompt}"
    cached_scores = head_scores(ck.head, held.features)
    cached_routes = [WORKERS[i] for i in cached_scores.argmax(axis=1)]

    router = Router.load(ckpt, device="cpu")
    assert router.encoder.resolved_dtype == ck.manifest.metrics["feature_dtype"]
    # the served vectors are the cached ones (within the dtype's tolerance; bit for bit where this
    # machine's kernels give it), alone or batched with prompts of other lengths
    served = np.concatenate([router.encoder.encode([p], [d]) for p, d in zip(held.prompts, held.domains)])
    batched = router.encoder.encode(held.prompts, held.domains)
    texts = router.encoder.settings.format(held.prompts, held.domains)
    assert_vector_parity(np.concatenate([served, batched]), np.concatenate([held.features] * 2),
                         router.encoder.resolved_dtype, lambda: encoder_batch_invariance(router.encoder, texts))
    # routes: one batch, one at a time, and the server's grouped micro-batches in a shuffled order
    batch = [d.worker_id for d in router.route_batch(held.prompts, held.domains)]
    single = [router.route(p, d).worker_id for p, d in zip(held.prompts, held.domains)]
    order = list(range(len(held.prompts)))
    random.Random(1).shuffle(order)
    grouped = route_grouped(router, [RouteRequest(held.prompts[i], held.domains[i]) for i in order])
    via_server = [None] * len(order)
    for i, d in zip(order, grouped):
        via_server[i] = d.worker_id
    n = len(cached_routes)
    assert n >= 25
    assert_routes_agree(cached_scores, [head_scores(ck.head, served), head_scores(ck.head, batched)],
                        {name: [WORKERS.index(w) for w in routes]
                         for name, routes in (("one batch", batch), ("one at a time", single), ("server", via_server))})
    router.close()


def test_a_flag_that_contradicts_the_contract_is_refused(trained, capsys):
    work, ckpt, args = trained
    assert main(["route", "--checkpoint", ckpt, "--prompt", "hi", "--device", "cpu", "--max-length", "512"]) == 2
    err = capsys.readouterr().err
    assert "--max-length 512 (the checkpoint has 24)" in err and "contradict the checkpoint's feature contract" in err

"""A cascade checkpoint over the stub workers (`serving.WORKERS`), or any three workers, for the
serving tests, the multi-turn report's tests and demos: the tiny encoder's features, a verifier
fitted on synthetic replies, and a fixed plan `[alpha, beta] stop if 2 agree or verifier ≥ 0.99 →
[gamma]` (serving is under test, not the search)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fugu_pipeline.testing.serving import WORKERS

def plan_over(workers: list[str]) -> dict:
    """The fixed plan over three workers: the first two at once, stop if they agree or the verifier
    scores one ≥ 0.99, else the third."""
    return {"default": {"steps": [{"workers": workers[:2], "agree": 2, "verify": 0.99}, {"workers": workers[2:3]}]}}


def build_cascade_checkpoint(models_dir: Path, cache_dir: Path, n: int = 60, seed: int = 0,
                             workers: list[str] | None = None, answer_kinds: dict | None = None,
                             context: bool = False, plan: dict | None = None, cross=None,
                             cap_usd: float | None = None, groups: tuple[str, ...] = ()) -> Path:
    """`workers`: three worker ids (default: the stub workers); `answer_kinds`: the final-answer
    kind per domain (default: numbers everywhere; `{}`: each task's grader decides); `context`: also
    fit and save the context verifier (policies/cascade/verifier_context.py: each reply read with the paid ones);
    `plan`: a policy of its own (default `plan_over(workers)`); `cross`: a fitted cross-encoder
    (`policies/cascade/cross_encoder.py`) whose column the verifier also reads, saved with it;
    `cap_usd`: the pooled cap ($ per request) it was trained under, as `train --cap` records it;
    `groups`: domains the rows take in turn, each with the plan and the two saved points of the pooled
    choice, their plans sharing `cap_usd` as `train --cap` shares it (`spend.share_parts` over the
    rows' mix)."""
    from fugu_pipeline.policies.cascade.answer_features import STATS, answer_text, embed_answers, reply_statistics
    from fugu_pipeline.features.contract import FeatureContract  # noqa: F401  (the data's contract type)
    from fugu_pipeline.features.encoder import Encoder
    from fugu_pipeline.features.routing_data import RoutingData
    from fugu_pipeline.features.settings import EncoderSettings
    from fugu_pipeline.reward import UtilityConfig
    from fugu_pipeline.tasks.final_answer import extract
    from fugu_pipeline.policies.cascade.fit import CascadeFit
    from fugu_pipeline.policies.cascade.save import save_cascade
    from fugu_pipeline.policies.cascade.policy import CascadePolicy
    from fugu_pipeline.policies.cascade.search import Choice
    from fugu_pipeline.policies.cascade.verifier import VerifierInputs, fit_all

    rng = np.random.default_rng(seed)
    settings = EncoderSettings(model="tiny", device="cpu", dtype="float32")
    enc = Encoder.load(settings)
    prompts = [f"What is {i} + {i % 7}?" for i in range(n)]
    right = rng.random((n, 3)) < [0.7, 0.72, 0.95]
    ids = list(workers or WORKERS)
    replies = np.empty((n, 3), dtype=object)
    for i in range(n):
        for j in range(3):
            value = i + i % 7 + (0 if right[i, j] else 1 + j)
            replies[i, j] = f"{i} + {i % 7} = {value}. #### {value}"
    finals = np.vectorize(lambda r: extract(r, "number"), otypes=[object])(replies)
    cells = [(i, j) for i in range(n) for j in range(3)]
    vecs = embed_answers([answer_text(replies[i, j], finals[i, j]) for i, j in cells], settings, cache_dir)
    stats = reply_statistics([(replies[i, j], finals[i, j], prompts[i]) for i, j in cells], STATS,
                             lambda texts: embed_answers(texts, settings, cache_dir), cache_dir)
    answer = np.zeros((n, 3, vecs.shape[1] + len(stats[0])), np.float32)
    for k, (i, j) in enumerate(cells):
        answer[i, j] = np.concatenate([vecs[k], stats[k]])
    feats = enc.encode(prompts, None)
    quality = right.astype(float)
    utility = UtilityConfig()
    domains = [groups[i % len(groups)] for i in range(n)] if groups else ["general"] * n
    data = RoutingData(task_ids=[f"c{i}" for i in range(n)], prompts=prompts, domains=domains,
                       splits=np.array(["train"] * n), worker_ids=ids, features=feats, utility=quality,
                       contract=enc.feature_contract(), quality=quality, cost_usd=np.tile([1e-4, 2e-4, 5e-3], (n, 1)),
                       utility_config=utility)
    enc.close()
    inputs = VerifierInputs(prompt=feats, answer=answer, has=np.ones((n, 3), bool), target=quality, stat_names=STATS)
    if cross is not None:
        from fugu_pipeline.policies.cascade.cross_encoder_use import with_column

        col = cross.score([prompts[i] for i, _ in cells], [replies[i, j] for i, j in cells]).reshape(n, 3)
        inputs = with_column(inputs, col)
    verifier = fit_all(inputs, np.arange(n), 0.01)
    policy = CascadePolicy.model_validate(plan or plan_over(ids))
    ctx = {}
    if context:
        from fugu_pipeline.policies.cascade.policy import answer_codes
        from fugu_pipeline.policies.cascade.verifier_context import fit_context

        base = np.full((n, 3), np.nan)
        X, _, at = inputs.design(np.arange(n))
        base[at[:, 0], at[:, 1]] = verifier.predict(X)
        ctx = fit_context(inputs, base, answer_codes(finals), np.arange(n) % 3).final.to_json()
    choice = Choice(policy.default, 0.9, 1e-3, 0.9, 1, [{"cost_usd": 3e-4, "quality": 0.8, "plan": policy.default.model_dump()},
                                                       {"cost_usd": 5e-3, "quality": 0.95, "plan": {"steps": [{"workers": ids[2:3]}]}}])
    choices, extra, group_caps = {"*": choice}, {}, None
    if groups:
        from fugu_pipeline.policies.cascade.spend import share_parts

        groups = tuple(dict.fromkeys(groups))  # each once, in order
        policy = CascadePolicy(default=policy.default, per_domain={g: policy.default for g in groups})
        choices.update({g: choice for g in groups})
        rows = [{"domain": g, "rows": domains.count(g)} for g in groups]
        extra = {"groups": {"chosen": rows, "merged": []}, "frontier_oof": {"rows": n}}
        if cap_usd is not None:
            got = share_parts([(g, choice.frontier, domains.count(g) / n) for g in groups], cap_usd, 1.645)
            group_caps = got[0] if got else None
    fit = CascadeFit(policy=policy, verifier=verifier, objective="utility", candidates=[], selected="cascade",
                     selected_kind="cascade", reason="a fixed plan for serving tests", verifier_figures={},
                     choices=choices, expected_cost=dict(zip(ids, [1e-4, 2e-4, 5e-3])), answers_version="stub",
                     worker_quality=dict(zip(ids, [0.7, 0.72, 0.95])),
                     answer_kinds={"*": "number"} if answer_kinds is None else answer_kinds,
                     stat_names=inputs.stat_names, context=ctx, cross_encoder=cross, cap_usd=cap_usd,
                     cap_z=None if cap_usd is None else 1.645, group_caps=group_caps or {})
    # as `train` records it: serving under --dtype auto then encodes in the dtype these features were (on a CPU
    # with native bf16, auto alone would serve bf16 against float32 features)
    return save_cascade(models_dir, data, fit, inputs.answer.shape[2], {"feature_dtype": settings.feature_dtype(), **extra})

"""A cascade's live term: the contest's live sample run as the cascade serves.

Each sampled held-out task is routed by the loaded `CascadeRouter` (its plan for the task's domain
or prompt cluster, at its own operating point) and run by `route.run_cascade`, the function the
server runs: each step's workers called at once, their answers read and verified before the next
step is paid for. The answer it returns is graded by the task's grader. Every worker call goes
through the one-step live evaluator's paid call (`evaluate/live.OneCallEvaluator.paid_call`): its
worst case held against `max_usd`, announced in the cost ledger before it is made and paid after;
a judge that grades the answer is paid as a `judge` line.

An outcome (quality, the calls its steps made, what they cost) is kept in the live store per
(cascade, task, seed) under the worker key `cascade:<content hash>`: a re-judgement reads it back
and calls nothing, and no other head's outcome is ever taken for it. A worker that refuses the key
(401, 402, 403) or a spend past `max_usd` stops the live term for both heads (`LiveUnavailable` in
the contest).
"""

from __future__ import annotations

import asyncio

from fugu_pipeline.evaluate.live import LiveOutcome


def store_key(content_hash: str) -> str:
    """The live store's worker field for a cascade's outcomes: its own, shared with no other head."""
    return f"cascade:{content_hash}"


class CascadeLive:
    """Runs a loaded cascade on tasks live through `calls` (an `OneCallEvaluator`: its workers,
    budget, ledger and store)."""

    def __init__(self, calls):
        self.calls = calls

    def evaluate(self, router, content_hash: str, tasks: list, seed: int = 0) -> list[LiveOutcome]:
        ev, key = self.calls, store_key(content_hash)
        found: dict[str, LiveOutcome] = {}
        for t in tasks:
            rec = ev.store.get(content_hash, t.task_id, key, seed) if ev.store is not None else None
            if rec is not None:
                found[t.task_id] = LiveOutcome(t.task_id, rec.quality, calls=rec.calls, turns=rec.turns,
                                               cost_usd=rec.cost_usd, workers=[], error=rec.error)
        todo = [t for t in tasks if t.task_id not in found]
        if todo:  # each outcome kept as it comes (a kill loses only the tasks in flight)
            for t, out in zip(todo, asyncio.run(self._run(router, todo, lambda o: ev.keep(content_hash, seed, key, o)))):
                found[t.task_id] = out
        return [found[t.task_id] for t in tasks]

    async def _run(self, router, tasks: list, done) -> list[LiveOutcome]:
        from fugu_pipeline.policies.cascade.route import run_cascade
        from fugu_pipeline.workers.contract import WorkerCallError
        from fugu_pipeline.workers.factory import make_client

        ev = self.calls
        ev.check_workers(router.checkpoint.manifest.worker_ids)
        clients: dict = {}
        judge = ev.judge_client(tasks)
        sem, lock = asyncio.Semaphore(ev.concurrency), asyncio.Lock()

        async def one(task) -> LiveOutcome:
            out = await served(task)
            await asyncio.to_thread(done, out)  # kept before the next task's calls
            return out

        async def served(task) -> LiveOutcome:
            async def call(worker: str):
                if worker not in clients:
                    clients[worker] = make_client(ev.config.worker(worker), ev.config)
                return await ev.paid_call(clients[worker], worker, task, task.task_id, lock)

            async with sem:  # routed when its turn comes, as a request is: a capped cascade follows its spend so far
                decision = await asyncio.to_thread(router.route, task.prompt, task.domain)
                steps = decision.router or router  # a cap its shipped description sends to another checkpoint
                run = await run_cascade(steps, task.prompt, task.domain, decision, call)
                if run.answer is None:
                    return LiveOutcome(task.task_id, 0.0, calls=run.calls, turns=run.calls, cost_usd=run.cost_usd,
                                       error=f"every call failed: {run.fallback_errors}"[:300])
                try:
                    g = await ev.paid_grade(task, run.answer.answer, judge, task.task_id, lock)
                except (WorkerCallError, ValueError) as exc:  # the judge failed: the answer was paid for
                    return LiveOutcome(task.task_id, 0.0, calls=run.calls, turns=run.calls, cost_usd=run.cost_usd,
                                       workers=[run.served_by], error=str(exc)[:300])
                return LiveOutcome(task.task_id, float(g.quality), calls=run.calls, turns=run.calls,
                                   cost_usd=run.cost_usd + g.judge_cost_usd, workers=[run.served_by])

        try:
            return list(await asyncio.gather(*(one(t) for t in tasks)))
        finally:
            for c in clients.values():
                await c.aclose()
            if judge is not None:
                await judge.aclose()

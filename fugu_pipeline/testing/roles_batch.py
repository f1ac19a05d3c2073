"""A BenchGen batch with three task families for multi-turn delegation, deterministic:

- `multistep` (a plan helps): arithmetic word problems of three or four steps, `numeric` grader.
  With `configs/workers.mock-roles.yaml` no worker gets more than about 40% of them right alone,
  but a good plan (the planner's, as Thinker) raises the next Worker's chance to about 75%. A check
  does not pay there: the Verifiers catch few wrong answers.
- `checking` (a check helps): price and unit calculations with one easy slip, `numeric` grader.
  Workers get about half of them right at once; the checker as Verifier catches about 90% of the
  wrong answers, and a Worker handed its objection gets the retry right about 90% of the time. A
  plan does not help.
- `lookup` (delegation only costs): one-fact questions (capitals, chemical symbols), `contains`
  and `exact` graders, which the cheapest worker gets right about 95% of the time at once.

Splits cycle train/val/test (60/15/25). Used by `scripts/make_roles_batch.py`, the tests and the
benchmarks; kept out of `data/benchgen/` so the main job's sample batch stays as it is.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

NAMES = ["Ada", "Ben", "Chen", "Dara", "Eli", "Farah", "Goro", "Hana", "Ivan", "Jun", "Kemi", "Lars"]
ITEMS = ["pencils", "apples", "tickets", "bottles", "stamps", "candles", "marbles", "books"]
CAPITALS = [("France", "Paris"), ("Japan", "Tokyo"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Canada", "Ottawa"),
            ("Egypt", "Cairo"), ("Norway", "Oslo"), ("Chile", "Santiago"), ("Spain", "Madrid"), ("Ghana", "Accra"),
            ("Nepal", "Kathmandu"), ("Italy", "Rome"), ("Poland", "Warsaw"), ("Cuba", "Havana"), ("Iran", "Tehran")]
ELEMENTS = [("gold", "Au"), ("iron", "Fe"), ("sodium", "Na"), ("silver", "Ag"), ("lead", "Pb"), ("potassium", "K"),
            ("tin", "Sn"), ("copper", "Cu"), ("mercury", "Hg"), ("tungsten", "W"), ("helium", "He"), ("zinc", "Zn")]


def split_for(i: int) -> str:
    r = i % 20
    return "train" if r < 12 else "val" if r < 15 else "test"


def multistep_task(i: int, rng: random.Random) -> dict:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c, d = rng.randint(3, 19), rng.randint(4, 24), rng.randint(5, 60), rng.randint(2, 30)
    kind = i % 3
    if kind == 0:
        prompt = (f"{name} packs {a} crates with {b} {item} each, adds {c} loose {item}, then {d} {item} break. "
                  f"How many whole {item} are left?")
        ans = a * b + c - d
    elif kind == 1:
        prompt = (f"A club buys {a} boxes of {item} at {b} dollars a box and pays {c} dollars for delivery. "
                  f"It splits the bill evenly between {d % 5 + 2} members, rounding to cents. What does each member pay?")
        ans = round((a * b + c) / (d % 5 + 2), 2)
    else:
        prompt = (f"{name} reads {a} pages on Monday, twice as many on Tuesday, {b} fewer than Tuesday on Wednesday "
                  f"and {c} on Thursday. How many pages in total over the four days?")
        ans = a + 2 * a + max(2 * a - b, 0) + c
    return {"task_id": f"multistep-{i:04d}", "prompt": prompt, "domain": "multistep", "reference_answer": str(ans),
            "grader": {"type": "numeric", "tolerance": 0.01}, "split": split_for(i), "tags": ["delegation-helps"]}


def checking_task(i: int, rng: random.Random) -> dict:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    kind = i % 3
    if kind == 0:
        price, off, tax = rng.randint(12, 240), rng.choice([10, 15, 20, 25, 30]), rng.choice([5, 8, 10, 12])
        prompt = (f"A shop sells {item} at {price} dollars. They are {off}% off, and a {tax}% sales tax is added to "
                  f"the discounted price. What does one cost, in dollars, rounded to cents?")
        ans = round(price * (100 - off) / 100 * (100 + tax) / 100, 2)
    elif kind == 1:
        km, mins = rng.randint(12, 95), rng.randint(14, 80)
        prompt = f"{name} cycles {km} km in {mins} minutes. What is the average speed in km per hour, rounded to cents?"
        ans = round(km / mins * 60, 2)
    else:
        a, b = rng.randint(3, 12), rng.randint(13, 48)
        c, d = rng.randint(1, a - 1), rng.randint(3, 9)
        prompt = (f"{name} buys {a} packs of {b} {item}, gives away {c} packs and uses the rest evenly over {d} days. "
                  f"How many {item} a day is that, rounded to cents?")
        ans = round((a - c) * b / d, 2)
    return {"task_id": f"checking-{i:04d}", "prompt": prompt, "domain": "checking", "reference_answer": str(ans),
            "grader": {"type": "numeric", "tolerance": 0.01}, "split": split_for(i), "tags": ["checking-helps"]}


def lookup_task(i: int, rng: random.Random) -> dict:
    if i % 2 == 0:
        country, city = CAPITALS[(i // 2) % len(CAPITALS)]
        prompt, ref, grader = f"What is the capital city of {country}? (question {i})", city, {"type": "contains"}
    else:
        el, sym = ELEMENTS[(i // 2) % len(ELEMENTS)]
        prompt = f"Give the chemical symbol for {el}. Reply with the symbol only. (item {i})"
        ref, grader = sym, {"type": "exact", "case_sensitive": True}
    return {"task_id": f"lookup-{i:04d}", "prompt": prompt, "domain": "lookup", "reference_answer": ref,
            "grader": grader, "split": split_for(i), "tags": ["delegation-costs"]}


FAMILIES = ("multistep", "checking", "lookup")


def roles_batch(n_per_family: int = 100, seed: int = 11, start: int = 0,
                families: tuple[str, ...] = FAMILIES) -> list[dict]:
    """`n_per_family` tasks of each family, interleaved. Each family draws from its own random
    stream, so adding a family leaves the others' tasks as they were."""
    makers = {"multistep": multistep_task, "checking": checking_task, "lookup": lookup_task}
    unknown = [f for f in families if f not in makers]
    if unknown:
        raise ValueError(f"unknown task family {unknown}; choose from {list(makers)}")
    rngs = {f: random.Random(seed if f != "checking" else seed * 7919 + 3) for f in families}
    rows = []
    for i in range(start, start + n_per_family):
        if "multistep" in rngs:
            rows.append(multistep_task(i, rngs["multistep"]))
        if "lookup" in rngs:
            rows.append(lookup_task(i, rngs["lookup"]))
        if "checking" in rngs:
            rows.append(checking_task(i, rngs["checking"]))
    return rows


def write_roles_batch(path: str | Path, n_per_family: int = 100, seed: int = 11, start: int = 0,
                      families: tuple[str, ...] = FAMILIES) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in roles_batch(n_per_family, seed, start, families)))
    return path

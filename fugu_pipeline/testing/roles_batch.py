"""A BenchGen batch with two task families for multi-turn delegation, deterministic:

- `multistep` (delegation helps): arithmetic word problems of three or four steps, `numeric`
  grader. With `configs/workers.mock-roles.yaml` no worker gets more than about 40% of them right
  alone, but a good plan raises a Worker's chance and a Verifier catches most wrong answers.
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


def roles_batch(n_per_family: int = 100, seed: int = 11, start: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(start, start + n_per_family):
        rows += [multistep_task(i, rng), lookup_task(i, rng)]
    return rows


def write_roles_batch(path: str | Path, n_per_family: int = 100, seed: int = 11, start: int = 0) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in roles_batch(n_per_family, seed, start)))
    return path

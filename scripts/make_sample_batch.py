"""Write the shipped sample BenchGen batch (`data/benchgen/sample.jsonl`) deterministically.

Math, code and general tasks, every grader type used, with train/val/test splits.
Run: .venv/bin/python scripts/make_sample_batch.py [--n-per-domain 100] [--out data/benchgen/sample.jsonl]
"""

import argparse
import json
import random
from pathlib import Path

NAMES = ["Ada", "Ben", "Chen", "Dara", "Eli", "Farah", "Goro", "Hana", "Ivan", "Jun"]
ITEMS = ["apples", "books", "coins", "stamps", "marbles", "pencils", "cards", "shells"]
CAPITALS = [("France", "Paris"), ("Japan", "Tokyo"), ("Kenya", "Nairobi"), ("Peru", "Lima"),
            ("Canada", "Ottawa"), ("Egypt", "Cairo"), ("Norway", "Oslo"), ("Chile", "Santiago"),
            ("India", "New Delhi"), ("Spain", "Madrid"), ("Ghana", "Accra"), ("Nepal", "Kathmandu")]
ELEMENTS = [("gold", "Au"), ("iron", "Fe"), ("sodium", "Na"), ("silver", "Ag"), ("lead", "Pb"),
            ("potassium", "K"), ("tin", "Sn"), ("copper", "Cu"), ("mercury", "Hg"), ("tungsten", "W")]
TOPICS = ["photosynthesis", "inflation", "plate tectonics", "the water cycle", "vaccination",
          "compound interest", "supply and demand", "the greenhouse effect", "natural selection"]


def split_for(i: int) -> str:
    r = i % 20
    return "test" if r < 5 else "val" if r < 8 else "train"


def math_task(i: int, rng: random.Random) -> dict:
    kind = i % 3
    a, b = rng.randint(3, 90), rng.randint(2, 40)
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    if kind == 0:
        prompt = f"{name} has {a} {item} and buys {b} more, then gives away {b // 2}. How many {item} does {name} have now?"
        ans, grader = a + b - b // 2, {"type": "numeric", "tolerance": 0}
    elif kind == 1:
        prompt = f"A box holds {b} {item}. How many {item} are in {a} boxes? Reply with the number only."
        ans, grader = a * b, {"type": "exact"}
    else:
        prompt = f"Compute {a} divided by {b}, rounded to two decimal places."
        ans, grader = round(a / b, 2), {"type": "numeric", "tolerance": 0.01}
    return {"task_id": f"math-{i:04d}", "prompt": prompt, "domain": "math",
            "reference_answer": str(ans), "grader": grader, "split": split_for(i), "tags": ["arithmetic"]}


def code_task(i: int, rng: random.Random) -> dict:
    kind = i % 3
    n = rng.randint(2, 9)
    if kind == 0:
        xs = [rng.randint(0, 20) for _ in range(n)]
        prompt = f"In Python, what does `sorted({xs})[-1]` evaluate to? Answer with the value."
        ref, grader = str(max(xs)), {"type": "regex", "pattern": rf"(?<!\d){max(xs)}(?!\d)"}
    elif kind == 1:
        word = rng.choice(["router", "matrix", "python", "kernel", "socket", "tensor"])
        prompt = f"Write a Python one-liner that reverses the string variable `s` (for example `s = '{word}'`)."
        ref, grader = "[::-1]", {"type": "contains"}
    else:
        name = rng.choice(["add", "total", "combine", "plus"])
        prompt = f"Write a Python function named `{name}_{i}` that returns the sum of its two arguments."
        ref = f"def {name}_{i}(a, b):\n    return a + b"
        grader = {"type": "regex", "pattern": rf"def\s+{name}_{i}\s*\("}
    return {"task_id": f"code-{i:04d}", "prompt": prompt, "domain": "code",
            "reference_answer": ref, "grader": grader, "split": split_for(i), "tags": ["python"]}


def general_task(i: int, rng: random.Random) -> dict:
    kind = i % 3
    if kind == 0:
        country, city = CAPITALS[i % len(CAPITALS)]
        prompt = f"What is the capital city of {country}? (question {i})"
        ref, grader = city, {"type": "contains"}
    elif kind == 1:
        el, sym = ELEMENTS[i % len(ELEMENTS)]
        prompt = f"Give the chemical symbol for {el}. Reply with the symbol only. (item {i})"
        ref, grader = sym, {"type": "exact", "case_sensitive": True}
    else:
        topic = TOPICS[i % len(TOPICS)]
        prompt = f"Explain {topic} to a twelve-year-old in three sentences. (prompt {i})"
        ref = f"clear explanation of {topic}"
        grader = {"type": "llm_judge", "rubric": f"Accurate, simple, at most three sentences about {topic}.", "scale": 10}
    return {"task_id": f"gen-{i:04d}", "prompt": prompt, "domain": "general",
            "reference_answer": ref, "grader": grader, "split": split_for(i), "tags": ["knowledge"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n-per-domain", type=int, default=100)
    ap.add_argument("--out", type=Path, default=Path("data/benchgen/sample.jsonl"))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--start", type=int, default=0, help="first task number (use a new range for a new batch)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    rows = []
    for i in range(args.start, args.start + args.n_per_domain):
        rows += [math_task(i, rng), code_task(i, rng), general_task(i, rng)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} tasks to {args.out}")


if __name__ == "__main__":
    main()

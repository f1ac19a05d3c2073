"""Write the BenchGen batch of the three multi-turn task families (`multistep`, where a plan helps,
`checking`, where a check helps, and `lookup`, where delegation only costs); see
`fugu_pipeline/testing/roles_batch.py`.

Run: .venv/bin/python scripts/make_roles_batch.py [--n-per-family 100] [--out data/roles/roles.jsonl]
Put the file in a project's data/benchgen/ to run the pipeline on it (not the shipped project's:
its main job stays on the sample batch).
"""

import argparse
from pathlib import Path

from fugu_pipeline.testing.roles_batch import write_roles_batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-per-family", type=int, default=100)
    ap.add_argument("--out", type=Path, default=Path("data/roles/roles.jsonl"))
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--start", type=int, default=0, help="first task number (a new range for a new batch)")
    args = ap.parse_args()
    path = write_roles_batch(args.out, args.n_per_family, args.seed, args.start)
    n = sum(1 for line in path.read_text().splitlines() if line.strip())
    print(f"wrote {n} tasks ({args.n_per_family} per family) to {path}")


if __name__ == "__main__":
    main()

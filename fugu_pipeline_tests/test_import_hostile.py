"""Crafted files through `fugu-lite import`, as a user runs it: each bad one gets one clear error
(exit 2, no traceback) naming the file and what to do, and an existing output is left as it was;
each odd but valid one imports exactly. Found by trying the importers on crafted input."""

from __future__ import annotations

import gzip
import json
import os
import stat

import polars as pl
import pytest

from fugu_pipeline.cli import main
from fugu_pipeline.matrix.import_format import read_reward_jsonl

KEEP = '{"task_id": "old"}\n'  # what --output held before each refused import


def run(tmp_path, capsys, *args: str) -> tuple[int, str]:
    out = tmp_path / "out.jsonl"
    out.write_text(KEEP, encoding="utf-8")
    rc = main(["import", *args, "--output", str(out)])
    err = capsys.readouterr().err
    if rc != 0:
        assert out.read_text(encoding="utf-8") == KEEP, "a refused import changed its output"
    return rc, err


def write(tmp_path, name: str, text: str | bytes) -> str:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return str(p)


GOOD = "prompt,a,b\nhello,1,0\nworld,0,1\n"


@pytest.mark.parametrize("case", [
    "truncated gzip", "truncated reward jsonl gzip", "corrupt gzip", "duplicate header", "stray text in a score column", "infinite score range",
    "ids equal but for case", "worker named split", "mixed quality and rewards", "output is a folder",
    "output is the input", "records without a score field", "prices in a folder", "negative dcrouter price",
    "blank prompt", "a BenchGen task file", "a ragged csv row", "a ragged tsv row",
    "a lone surrogate in a jsonl table", "rewards of 1e308", "a negative cost", "a negative latency",
])
def test_bad_input_gets_one_clear_error_and_keeps_the_output(tmp_path, capsys, case):
    good = write(tmp_path, "good.csv", GOOD)
    gz = gzip.compress(GOOD.encode())
    if case == "truncated gzip":
        args, needle = ["table", write(tmp_path, "t.csv.gz", gz[:30])], "not a valid gzip file"
    elif case == "truncated reward jsonl gzip":  # read_reward_jsonl reads through the same read_bytes
        row = json.dumps({"task_id": "t", "prompt": "p", "worker_ids": ["a", "b"], "quality": [1, 0]})
        args, needle = ["jsonl", write(tmp_path, "r.jsonl.gz", gzip.compress((row + "\n").encode())[:20])], "not a valid gzip file"
    elif case == "corrupt gzip":
        bad = bytearray(gz)
        bad[20:26] = b"\xff" * 6
        args, needle = ["table", write(tmp_path, "t.csv.gz", bytes(bad))], "not a valid gzip file"
    elif case == "duplicate header":
        args, needle = ["table", write(tmp_path, "d.csv", "prompt,a,a,b\nhi,1,0,1\nyo,0,1,0\n")], "names column 'a' twice"
    elif case == "stray text in a score column":
        args, needle = ["table", write(tmp_path, "s.csv", "prompt,a,b,c\nhello,0.5 ,1,0\nx,1,0,1\ny,0,1,1\n")], \
            "column 'a' holds numbers but row 1 holds '0.5 '"
    elif case == "infinite score range":
        args, needle = ["table", good, "--score-range", "1,inf"], "give finite numbers"
    elif case == "ids equal but for case":
        calls = "prompt,model,score\nq,GPT-4,1\nq,gpt-4,0\nr,GPT-4,0\nr,gpt-4,1\n"
        args, needle = ["long", write(tmp_path, "l.csv", calls)], "clashes with 'GPT-4'"
    elif case == "worker named split":
        args, needle = ["table", write(tmp_path, "w.csv", "prompt,a,split\nq,1,0\nr,0,1\n")], "'split' clashes"
    elif case == "mixed quality and rewards":
        rows = ['{"task_id":"t1","prompt":"p","worker_ids":["a","b"],"quality":[1,0]}',
                '{"task_id":"t2","prompt":"q","worker_ids":["a","b"],"rewards":[5,-3]}']
        args, needle = ["jsonl", write(tmp_path, "m.jsonl", "\n".join(rows))], "gives rewards where the first row gives quality"
    elif case == "output is a folder":
        (tmp_path / "dir").mkdir()
        rc = main(["import", "table", good, "--output", str(tmp_path / "dir")])
        assert rc == 2 and "--output is a folder" in capsys.readouterr().err
        return
    elif case == "output is the input":
        rc = main(["import", "table", good, "--output", good])
        assert rc == 2 and "a file this import reads" in capsys.readouterr().err
        assert (tmp_path / "good.csv").read_text() == GOOD
        return
    elif case == "records without a score field":
        df = pl.DataFrame({"prompt": ["p", "q"], "m1": [{"acc": 1.0}, {"acc": 0.0}], "m2": [{"acc": 0.0}, {"acc": 1.0}]})
        df.write_parquet(tmp_path / "r.parquet")
        args, needle = ["table", str(tmp_path / "r.parquet")], "--score-field"
    elif case == "prices in a folder":
        df = pl.DataFrame({"prompt": ["p", "q"], "m1": [{"score": 1.0, "num_input_tokens": 3, "num_output_tokens": 4}] * 2,
                           "m2": [{"score": 0.0, "num_input_tokens": 3, "num_output_tokens": 4}] * 2})
        df.write_parquet(tmp_path / "r.parquet")
        (tmp_path / "prices").mkdir()
        args, needle = ["table", str(tmp_path / "r.parquet"), "--prices", str(tmp_path / "prices")], "price list not found"
    elif case == "blank prompt":
        row = {"task_id": "t", "prompt": " \u00a0\u200b", "worker_ids": ["a", "b"], "quality": [1, 0]}
        args, needle = ["jsonl", write(tmp_path, "b.jsonl", json.dumps(row))], "the prompt is blank"
    elif case in ("rewards of 1e308", "a negative cost", "a negative latency"):  # 1e308 overflowed training
        row = {"task_id": "t", "prompt": "p", "worker_ids": ["a", "b"], "rewards": [1e308, -1e308]}
        field = {"rewards of 1e308": "rewards", "a negative cost": "cost_usd", "a negative latency": "latency_s"}[case]
        if field != "rewards":
            row = {**row, "rewards": [1, 0], field: [0.5, -0.01]}
        args, needle = ["jsonl", write(tmp_path, "r.jsonl", json.dumps(row) + "\n")], \
            f"r.jsonl:1: '{field}' holds " + ("values beyond" if field == "rewards" else "negative values")
    elif case == "a lone surrogate in a jsonl table":  # polars read it as U+0000 without a word
        rows = '{"prompt": "ok \\ud83d\\ude00", "a": 1, "b": 0}\n{"prompt": "hi \\ud800 x", "a": 0, "b": 1}\n'
        args, needle = ["table", write(tmp_path, "s.jsonl", rows)], "line 2: a string holds a lone UTF-16 surrogate"
    elif case == "a ragged csv row":  # a quoted comma and a quoted line break before it do not count
        args, needle = ["table", write(tmp_path, "r.csv", 'prompt,a,b\n"hi, you",1,0\n"two\nlines",0,1\nx,1,1,1\n')], \
            "row 3 (line 5) has 4 cells where the header names 3 columns"
    elif case == "a ragged tsv row":
        args, needle = ["table", write(tmp_path, "r.tsv", 'prompt\ta\tb\n"q\t1\t0\nx\t1\t1\t1\n')], \
            "row 2 (line 3) has 4 cells"
    elif case == "a BenchGen task file":  # 300 lines each missing worker_ids: one line that says what the file is
        tasks = [{"task_id": f"m{i}", "prompt": f"{i} + 1?", "domain": "math", "reference_answer": str(i + 1),
                  "grader": {"type": "numeric", "tolerance": 0}, "split": "test"} for i in range(300)]
        args, needle = ["jsonl", write(tmp_path, "tasks.jsonl", "".join(json.dumps(t) + "\n" for t in tasks))], \
            "a BenchGen task file"
        rc, err = run(tmp_path, capsys, *args)
        assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err
        return
    else:  # negative dcrouter price
        folder = tmp_path / "dc"
        folder.mkdir()
        rec = [{"question": "q1", "scores": {"m1": 1.0, "m2": 0.0}}, {"question": "q2", "scores": {"m1": 0.0, "m2": 1.0}}]
        for part in ("train", "test"):
            (folder / f"dcrouter_{part}.json").write_text(json.dumps(rec))
        (folder / "default_llm.json").write_text(json.dumps({"m1": {"input_price": -5, "output_price": 1},
                                                              "m2": {"input_price": 1, "output_price": 1}}))
        args, needle = ["dcrouter", str(folder)], "must be finite and not negative"
    rc, err = run(tmp_path, capsys, *args)
    assert rc == 2, err
    assert needle in err and "Traceback" not in err, err


def test_odd_but_valid_files_import_exactly(tmp_path, capsys):
    # an id column of digits stays text; a TSV cell may hold a quote; a BOM and CRLF in a reward JSONL
    ids = write(tmp_path, "ids.csv", "id,prompt,a,b\n007,hello,1,0\n7,x,0,1\n")
    assert main(["import", "table", ids, "--id-column", "id", "--output", str(tmp_path / "ids.jsonl")]) == 0
    assert [r.task_id for r in read_reward_jsonl(tmp_path / "ids.jsonl")] == ["007", "7"]
    tsv = write(tmp_path, "q.tsv", 'prompt\ta\tb\n"hi" there\t1\t0\n5" screen\t0\t1\n')
    assert main(["import", "table", tsv, "--output", str(tmp_path / "q.jsonl")]) == 0
    assert [r.prompt for r in read_reward_jsonl(tmp_path / "q.jsonl")] == ['"hi" there', '5" screen']
    bom = write(tmp_path, "bom.jsonl", '\ufeff{"task_id":"t1","prompt":"p","worker_ids":["a","b"],"quality":[1,0]}\r\n')
    assert [r.task_id for r in read_reward_jsonl(bom)] == ["t1"]
    # rows of a JSON Lines table mixing text and conversations: each row read as serve routes it
    mixed = [{"prompt": "plain", "a": 1, "b": 0},
             {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "the question"}], "a": 0, "b": 1},
             {"prompt": ["first turn", "second"], "a": 1, "b": 1}]
    src = write(tmp_path, "mixed.jsonl", "\n".join(json.dumps(r) for r in mixed))
    assert main(["import", "table", src, "--output", str(tmp_path / "mixed_out.jsonl")]) == 0
    assert [r.prompt for r in read_reward_jsonl(tmp_path / "mixed_out.jsonl")] == ["plain", "the question", "first turn"]
    # a gzip output is gzip, and a new file gets the umask's mode, not mkstemp's 0600
    good = write(tmp_path, "good.csv", GOOD)
    assert main(["import", "table", good, "--output", str(tmp_path / "o.jsonl.gz")]) == 0
    assert len(read_reward_jsonl(tmp_path / "o.jsonl.gz")) == 2
    mode = stat.S_IMODE(os.stat(tmp_path / "o.jsonl.gz").st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask
    capsys.readouterr()


def test_split_files_that_share_a_name_and_order_their_columns_differently(tmp_path):
    """`rb.train.csv` and `rb.test.csv` give default ids that cannot clash; a test file with the same
    workers in another column order is aligned; a training prompt the test file also holds is dropped."""
    write(tmp_path, "rb.train.csv", "prompt,a,b\nq1,1,0\nq2,0,1\nshared,1,1\n")
    write(tmp_path, "rb.test.csv", "prompt,b,a\nq3,1,0\nshared,0,1\n")
    for kind in ("table", "long"):
        if kind == "long":
            for name in ("rb.train.csv", "rb.test.csv"):
                wide = pl.read_csv(tmp_path / name)
                wide.unpivot(index="prompt", variable_name="model", value_name="score").write_csv(tmp_path / f"l.{name}")
        prefix = "l." if kind == "long" else ""
        out = tmp_path / f"{kind}.jsonl"
        assert main(["import", kind, str(tmp_path / f"{prefix}rb.train.csv"), "--test-file",
                     str(tmp_path / f"{prefix}rb.test.csv"), "--output", str(out)]) == 0
        rows = {(r.prompt, r.split): r for r in read_reward_jsonl(out)}
        assert set(rows) == {("q1", "train"), ("q2", "train"), ("q3", "test"), ("shared", "test")}, kind
        assert rows[("q3", "test")].worker_ids == ["a", "b"] and rows[("q3", "test")].quality == [0.0, 1.0], kind
        assert rows[("shared", "test")].quality == [1.0, 0.0], kind

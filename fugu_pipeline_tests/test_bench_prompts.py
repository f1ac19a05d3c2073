"""`benchmarks/bench_encoder.py --prompts` reads real prompts in the shapes they are published in: a
JSONL file (LLMRouter's queries) and one JSON list of objects (RouterDC's preprocessed
`dcrouter_*.json`), each gzipped or not, the first n rows with a prompt, query or question."""

from __future__ import annotations

import gzip
import json

import pytest

from benchmarks.bench_encoder import read_prompts

ROWS = [{"question": "Q: what is 2 + 2?", "gt": "4"}, {"query": "Name a prime."}, {"id": 3},
        {"prompt": "Translate 'chat'.", "question": 7}, {"question": "Q: a line\u2028separator and a \x1c"},
        {"question": "Q: last one"}]
WANT = ["Q: what is 2 + 2?", "Name a prime.", "Translate 'chat'.", "Q: a line\u2028separator and a \x1c", "Q: last one"]


@pytest.mark.parametrize("shape", ["jsonl", "json-list", "json-list-indented"])
@pytest.mark.parametrize("gz", [False, True])
def test_read_prompts_takes_jsonl_and_a_json_list(tmp_path, shape, gz):
    # ensure_ascii=False: the separators are written raw, as real files hold them (a line is still one row)
    text = ("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ROWS) if shape == "jsonl"
            else json.dumps(ROWS, indent=2 if shape.endswith("indented") else None))
    if shape == "json-list-indented":
        text = "\n  " + text  # whitespace before the list
    path = tmp_path / ("p.json" + (".gz" if gz else ""))
    with (gzip.open if gz else open)(path, "wt", encoding="utf-8") as fh:
        fh.write(text)
    assert read_prompts(str(path), 10) == WANT
    assert read_prompts(str(path), 2) == WANT[:2]


@pytest.mark.parametrize("text, says", [("[1, 2]", "row 1 is a int"), ('{"prompt": "a"}\n{"prompt": \n', "not JSONL nor one JSON list")])
def test_read_prompts_names_the_file_of_a_bad_prompt_file(tmp_path, text, says):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(SystemExit) as exc:
        read_prompts(str(path), 10)
    assert str(path) in str(exc.value) and says in str(exc.value)

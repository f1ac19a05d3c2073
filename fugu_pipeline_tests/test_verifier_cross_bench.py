"""`benchmarks/verifier_cross.py --cross-encoder off`: the verifier as it is, its out-of-fold AUC and
frontier, without a cross-encoder fit (the built-in tiny encoder reads the prompts)."""

from __future__ import annotations

import json

from benchmarks.verifier_cross import SHARES, main


def test_the_verifier_alone_is_measured_without_a_cross_encoder_fit(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["--encoder", "tiny", "--cross-encoder", "off", "--synthetic", "mc2", "--rows", "120",
                 "--work-dir", str(tmp_path / "w"), "--cache-dir", str(tmp_path / "c"), "--out", str(out)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    assert r["cross_encoder"] is None and set(r["auc"]) == {"old"} and 0.0 <= r["auc"]["old"] <= 1.0
    assert sorted(r["auc_by_worker"]["old"]) == ["large", "medium", "small"]
    assert [f["share"] for f in r["frontier"]] == list(SHARES) and r["strongest"][0] == "large"
    said = capsys.readouterr().out
    assert "verifier (prompt and reply apart, no cross-encoder): out-of-fold AUC" in said
    assert "cross-encoder fit" not in said  # nothing fine-tuned

"""`specdec bench` on a tiny model with two drafters and the transformers peers: well-formed reports."""

import json

from specdec.bench.tasks import load_prompts
from specdec.cli import main


def test_bench_report_and_json(tiny_dirs, tmp_path, capsys):
    target = str(tiny_dirs["qwen2"])
    out = tmp_path / "report"
    code = main(["bench", "--target", target, "--drafters", f"ngram,draft:{target}", "--tasks", "code",
                 "--limit", "2", "--max-new-tokens", "12", "--k", "3", "--peers", f"plain,lookup,assisted:{target}",
                 "--json", str(tmp_path / "r.json"), "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "| plain |" in printed and "| ngram |" in printed and "hf-assisted" in printed
    results = json.loads((tmp_path / "r.json").read_text())
    methods = {r["method"] for r in results["runs"]}
    assert methods == {"plain", "ngram", f"draft:{target}", "hf-plain", "hf-lookup", f"hf-assisted:{target}"}
    assert len(results["runs"]) == 2 * 6
    ours = [r for r in results["runs"] if r["method"].startswith(("ngram", "draft"))]
    assert all(r["matches_plain"] for r in ours)  # greedy speculative output equals plain decoding
    assert all(r["tau"] >= 1 for r in ours)
    assert (out / "report.md").read_text().startswith("target")


def test_code_task_mixes_chat_and_completion_prompts():
    prompts = load_prompts(["code"], 4)
    assert [p.chat for p in prompts] == [True, False, True, False]

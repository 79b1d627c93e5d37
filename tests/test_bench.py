"""`specdec bench` on a tiny model with two drafters and the transformers peers: well-formed reports."""

import json
import platform

from specdec.bench.tasks import load_prompts
from specdec.cli import main


def test_bench_report_and_json(tiny_dirs, tmp_path, capsys):
    target = str(tiny_dirs["qwen2"])
    out = tmp_path / "report"
    code = main(["bench", "--target", target, "--drafters", f"ngram,draft:{target}", "--tasks", "code",
                 "--limit", "2", "--max-new-tokens", "12", "--k", "3", "--peers", f"plain,lookup,assisted:{target}",
                 "--json", str(tmp_path / "r.json"), "--out", str(out), "--roofline-mb", "16"])
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
    assert json.loads((out / "results.json").read_text()) == results
    for chart in ("speedup_per_task.png", "tokens_per_round.png"):
        assert (out / chart).read_bytes().startswith(b"\x89PNG")
    assert not list(out.glob("*.partial*"))
    roofline = results["roofline"]
    assert roofline["bandwidth_gb_s"] > 0 and roofline["weight_bytes_per_token"] > 0
    assert "roofline: measured bandwidth" in printed and "| plain |" in printed.split("roofline:")[1]
    plain = [r for r in results["runs"] if r["method"] == "plain"]
    assert all(r["rounds"] == r["new_tokens"] and r["drafted"] == 0 for r in plain)
    from specdec.drafters.base import module_bytes
    from specdec.models.sources.loading import load_model
    memory = results["memory"]  # the tiny target's float32 weights, as the bench loaded them
    assert abs(memory["target_weights_mb"] - module_bytes(load_model(target).model) / 1e6) < 1e-9
    assert memory["peak_rss_mb"] > memory["target_weights_mb"] and "memory: the target's weights" in printed
    # which machine the figures came from: the CPU's name and the kernel build that ran on it
    from specdec.kernels.build import cpu_has_avx2_fma_f16c, cpu_has_avx512_vnni, cpuinfo_field, default_kernel_name
    machine = results["machine"]
    assert machine["cpu"] == (cpuinfo_field("model name") or platform.machine())
    assert machine["cpu_kernels"] == default_kernel_name()
    if cpu_has_avx2_fma_f16c():  # the CPUs CI runs on: their build is named by what it uses
        assert machine["cpu_kernels"].startswith("AVX-512 VNNI" if cpu_has_avx512_vnni() else "AVX2")
    assert f"machine: {machine['cpu']}, CPU kernels {machine['cpu_kernels']}" in printed

    assert main(["analyze", "--from-bench", str(tmp_path / "r.json"), "--plot", str(tmp_path / "fit.png")]) == 0
    fitted = capsys.readouterr().out
    assert "| ngram |" in fitted and f"| draft:{target} |" in fitted
    assert (tmp_path / "fit.png").exists()


def test_code_task_mixes_chat_and_completion_prompts():
    prompts = load_prompts(["code"], 4)
    assert [p.chat for p in prompts] == [True, False, True, False]


def test_weight_bytes_per_token_counts_each_matrix_once(tiny_dirs):
    from specdec.bench.roofline import weight_bytes_per_token
    from specdec.models.sources.loading import load_model

    for kind, tied in (("llama", False), ("qwen2", True)):
        native = load_model(str(tiny_dirs[kind]))
        hf = load_model(str(tiny_dirs[kind]), backend="transformers").model.model
        every = sum(p.numel() * 4 for p in hf.parameters())  # parameters() lists a tied matrix once
        every += sum(b.numel() * 4 for b in hf.buffers() if b.is_floating_point())  # rope frequencies
        embedding = hf.get_input_embeddings().weight
        expected = every if tied else every - embedding.numel() * 4 + embedding.shape[1] * 4
        assert weight_bytes_per_token(hf) == expected
        packed_padding = weight_bytes_per_token(native.model) - expected
        assert 0 <= packed_padding < 0.05 * expected  # packed panels round columns up to 16


def test_quality_of_weight_formats_against_float32(tiny_dirs):
    from specdec.bench.quality import measure
    from specdec.kernels import packed_kernel

    formats = ["float32", "int7", "int4"] if packed_kernel() is not None else ["float32"]
    rows = {(r.weights, r.text): r for r in measure(str(tiny_dirs["qwen2"]), formats, tokens=96)}
    reference = rows[("float32", "code")]
    assert reference.top1_agreement == 1.0 and abs(reference.kl_from_float32) < 1e-6 and reference.perplexity > 1
    if packed_kernel() is not None:  # more bits, closer to float32
        assert rows[("int7", "code")].kl_from_float32 < rows[("int4", "code")].kl_from_float32
        assert rows[("int7", "code")].top1_agreement >= rows[("int4", "code")].top1_agreement


def test_forward_cost_table_times_runtimes_in_turns(tiny_dirs, capsys):
    from specdec.bench.forward_cost import main as forward_cost

    forward_cost([str(tiny_dirs["qwen2"]), "--runtimes", "packed,torch", "--sizes", "1,3", "--repeats", "2",
                  "--interleave", "--context", "8"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"| {tiny_dirs['qwen2']}")]
    assert len(rows) == 2 and all("(1.00x)" in row and row.count("|") == 5 for row in rows)


def test_edit_and_longdoc_tasks_quote_real_code():
    """The editing tasks' prompts hold a whole standard-library function (edit) or module (longdoc,
    longedit), so the answer can repeat it; the limit applies per task."""
    edits, quotes = load_prompts(["edit"], 8), load_prompts(["longdoc"], 2)
    long_edits = load_prompts(["longedit"], 4)
    assert len(edits) == 8 and len(quotes) == 2 and len({p.prompt_id for p in edits}) == 8
    assert len({p.prompt_id for p in long_edits}) == 4
    for prompt in edits + quotes + long_edits:
        assert prompt.chat and "```python\n" in prompt.prompt and "def " in prompt.prompt
    assert all(len(p.prompt) > 6000 for p in quotes) and all(len(p.prompt) < 12000 for p in edits)
    assert all(len(p.prompt) > 12000 for p in long_edits)  # whole modules of ~4k tokens

"""The one-screen human summary of a certify report."""

from __future__ import annotations

from specdec.certify.local import CertifyReport
from specdec.certify.statistics import POWER, ChiSquareResult


def describe_test(result: ChiSquareResult) -> str:
    verdict = "pass" if result.passed else "FAIL"
    return (f"chi-square {result.statistic:.1f} on {result.dof} dof, p = {result.p_value:.3g} ({verdict} at "
            f"{result.alpha:.2g}); {result.samples} draws would catch a binned TV >= {result.detectable_tv:.3f} "
            f"with probability {POWER:.0%}")


def summary(report: CertifyReport) -> str:
    config, settings = report.configuration, report.settings
    lines = [f"specdec certify: {', '.join(f'{key} {value}' for key, value in config.items())}"]
    greedy = report.greedy
    counts = {outcome: sum(case.outcome == outcome for case in greedy)
              for outcome in ("identical", "exact tie", "near tie", "mismatch")}
    lines.append(f"greedy, {settings.greedy_tokens} new tokens on {len(greedy)} prompts: "
                 + ", ".join(f"{count} {outcome}" for outcome, count in counts.items() if count or outcome == "mismatch"))
    for case in greedy:
        if case.outcome != "identical":
            lines.append(f"  {case.prompt_id}: {case.outcome} at new token {case.first_difference} "
                         f"(top-two logit gap {case.margin:.3g}; near tie <= {settings.tie_margin:g})")
    if report.sampled:
        lines.append(f"sampled, {settings.samples} draws per prompt (seeds {settings.seed}..), run-wide "
                     f"false-alarm rate {settings.alpha:g}:")
    for case in report.sampled:
        if case.first_token is not None:
            lines.append(f"  {case.prompt_id}: first new token vs the target's exact distribution: "
                         f"{describe_test(case.first_token)}")
        if case.seeded_identical is not None:
            mark = "" if case.seeded_identical == case.draws else "  FAIL"
            lines.append(f"  {case.prompt_id}: first {settings.joint_tokens} new tokens equal plain sampling with "
                         f"the same seed in {case.seeded_identical}/{case.draws} draws{mark}")
        if case.joint is not None:
            lines.append(f"  {case.prompt_id}: first {settings.joint_tokens} new tokens vs plain sampling: "
                         f"{describe_test(case.joint)}")
    if "other server" in str(config.get("reference", "")):
        lines.append("note: the reference is another server; engines round differently (kernels, batching), so a "
                     "difference may be arithmetic rather than lossy speculation")
    if not report.sampled:
        lines.append("sampled: not run (temperature 0: greedy equality is the whole claim)")
    lines.append("PASSED: no check found a difference from the target's own decoding" if report.passed
                 else "FAILED: see the lines marked FAIL or mismatch above")
    return "\n".join(lines)

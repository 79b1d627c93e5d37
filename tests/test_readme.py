"""README's set-up commands stay true: CI runs the very test command the README shows."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = text.split("```bash\n")[1:3]
    return [block.split("\n```")[0].strip() for block in blocks]


def test_ci_runs_the_readme_test_command():
    main_job, test_command = readme_commands()
    assert "specdec generate" in main_job and "pytest" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_readme_prose_comes_in_short_paragraphs():
    """A newcomer reads the README top to bottom: no paragraph of prose over ~1,200 characters (code blocks
    and tables are not prose)."""
    import re

    text = re.sub(r"```.*?```", "", (ROOT / "README.md").read_text(), flags=re.S)
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip() and not p.lstrip().startswith("|")]
    assert max(len(p) for p in paragraphs) <= 1200

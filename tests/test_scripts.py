"""The lab tools in scripts/ stay importable: a refactor that renames what they use fails here, not in
the next session that reaches for them."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parent.parent / "scripts").rglob("*.py"))  # tools and lab/


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_script_imports(path):
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would: dataclasses look their module up there
    spec.loader.exec_module(module)  # each runs its work only under __main__
    assert callable(getattr(module, "main", None)), f"{path.name} has no main()"

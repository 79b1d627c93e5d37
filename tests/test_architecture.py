"""The layers' import rules (DESIGN.md, Architecture): arrows point down only. Checked on the source with
`ast`, so a rule broken by a function-level import is caught too."""

from __future__ import annotations

import ast
from pathlib import Path

import specdec

PACKAGE = Path(specdec.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every specdec module a file imports, anywhere in it (top level or inside functions)."""
    tree = ast.parse(path.read_text(), str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("specdec")}


def files_under(*folders: str) -> list[Path]:
    return [path for folder in folders for path in sorted((PACKAGE / folder).rglob("*.py"))]


def violations(files: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    return [f"{path.relative_to(PACKAGE)} imports {name}" for path in files for name in sorted(imported_modules(path))
            if any(name == rule or name.startswith(rule + ".") for rule in forbidden)]


def test_front_ends_reach_the_engine_only_through_the_api():
    assert violations(files_under("server", "bench", "certify", "training", "commands"), ("specdec.engine",)) == []


def test_the_pairing_sits_below_the_front_ends():
    """--drafter auto is the API's to resolve: it reads models, drafters and the engine, never a front end."""
    above = ("specdec.api", "specdec.server", "specdec.bench", "specdec.certify", "specdec.training", "specdec.cli",
             "specdec.commands")
    assert violations(files_under("pairing"), above) == []


def test_the_core_imports_nothing_above_it():
    above = ("specdec.engine", "specdec.api", "specdec.drafters", "specdec.heads", "specdec.models",
             "specdec.server", "specdec.bench", "specdec.certify", "specdec.training", "specdec.cli",
             "specdec.commands", "specdec.pairing")
    assert violations(files_under("core"), above) == []


def test_models_and_kernels_import_nothing_above_them():
    above = ("specdec.engine", "specdec.api", "specdec.core", "specdec.drafters", "specdec.heads", "specdec.server",
             "specdec.bench", "specdec.certify", "specdec.training", "specdec.cli", "specdec.commands",
             "specdec.pairing")
    assert violations(files_under("models", "kernels"), above) == []


def test_drafters_import_neither_the_engine_nor_the_faces():
    above = ("specdec.engine", "specdec.api", "specdec.server", "specdec.bench", "specdec.certify",
             "specdec.training", "specdec.cli", "specdec.commands", "specdec.pairing")
    assert violations(files_under("drafters"), above) == []


def module_graph() -> dict[str, set[str]]:
    """specdec module -> the specdec modules it imports (packages' __init__ files left out: they re-export)."""
    modules = {".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts): path
               for path in PACKAGE.rglob("*.py") if path.name != "__init__.py"}
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {other for other in found if other in modules and other != name}
    return graph


def test_no_two_modules_import_each_other_even_inside_functions():
    graph = module_graph()
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def cycle_from(module: str, path: list[str]) -> list[str] | None:
        seen[module] = 1
        for other in sorted(graph[module]):
            if seen.get(other) == 1:
                return path[path.index(other):] + [other] if other in path else [module, other]
            if other not in seen and (found := cycle_from(other, path + [other])):
                return found
        seen[module] = 2
        return None

    for module in sorted(graph):
        if module not in seen:
            assert cycle_from(module, [module]) is None


def test_the_checker_sees_imports_inside_functions(tmp_path):
    """The rule checks would pass vacuously if the walk missed function-level imports."""
    module = tmp_path / "sample.py"
    module.write_text("def f():\n    from specdec.engine import SpeculativeEngine\n    import specdec.api.batch\n")
    assert imported_modules(module) >= {"specdec.engine", "specdec.api.batch"}


def long_functions(limit: int) -> list[str]:
    """Functions (methods and nested functions included) of more than `limit` lines in specdec/."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= limit:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    return found


def test_no_function_is_over_80_lines():
    assert long_functions(80) == []


def test_a_generation_is_a_short_class_whose_features_are_round_steps():
    """The round's features (grammar, logprobs, target features) live in engine/round_steps.py: Generation
    stays short and names none of them."""
    from specdec.engine.generation import Generation

    source = (PACKAGE / "engine" / "generation.py").read_text()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == Generation.__name__)
    assert node.end_lineno - node.lineno < 150
    body = ast.get_source_segment(source, node)
    assert not any(name in body for name in ("constraint.", "masked_logits(", "token_logprobs(", "take_features("))


def places(pattern: str) -> set[str]:
    """The specdec/ files whose source matches `pattern` (a regular expression)."""
    import re

    return {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if re.search(pattern, path.read_text())}


def test_k_the_drafter_spec_and_the_acceptance_rule_are_each_read_in_one_place():
    """Each setting's grammar has one reader (KSetting.parse, DrafterChoice.parse, Acceptance.parse), called at
    the front ends' edges; below them only the typed values travel, so no module reads the text again."""
    assert places(r"""startswith\(["']auto""") == {"core/speculation_length.py"}
    # (bench/llama_cpp.py splits llama.cpp's own speculative types, llamacpp-spec:A+B)
    assert places(r"""split\(["']\+["']\)""") - {"bench/llama_cpp.py"} == {"drafters/registry.py"}
    assert places(r"""[=!]= ["'](match|rejection)["']""") == set()
    drafter_text = r"""(spec|drafter)\S* ([=!]=|in) \(?["'](default|none)["']"""
    assert places(drafter_text) <= {"drafters/registry.py", "hints.py"}  # stats name plain decoding "none"

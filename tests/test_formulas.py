"""formulas.py imports every module that registers a formula or a source, so the report lists them all; citations.py
imports none of them (the registry is filled from below)."""
import ast
import re
from pathlib import Path

import nnmem_sweep
from nnmem_sweep import citations, formulas

PACKAGE = Path(nnmem_sweep.__file__).parent
REGISTERS = re.compile(r"^@formula\(|^\w+ = source\(", re.MULTILINE)


def _module(path: Path) -> str:
    return ".".join(("nnmem_sweep", *path.relative_to(PACKAGE).with_suffix("").parts))


def test_every_module_that_registers_a_formula_is_imported_by_formulas_py():
    registering = {_module(p) for p in PACKAGE.rglob("*.py") if REGISTERS.search(p.read_text(encoding="utf-8"))}
    assert "nnmem_sweep.components.kv" in registering and "nnmem_sweep.serving" in registering
    assert registering == {m.__name__ for m in formulas.REGISTERING_MODULES}


def test_the_list_holds_a_formula_of_every_registering_module_and_is_sorted():
    listed = formulas.all_formulas()
    modules = {f.module for f in listed}
    assert {"nnmem_sweep.parallel.states", "nnmem_sweep.serving", "nnmem_sweep.models.count"} <= modules
    assert [f.name for f in listed] == sorted(f.name for f in listed)


def test_citations_imports_nothing_of_the_package():
    tree = ast.parse(Path(citations.__file__).read_text(encoding="utf-8"))
    ours = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.level or "nnmem_sweep" in n.module)]
    ours += [n for n in ast.walk(tree) if isinstance(n, ast.Import) and any("nnmem_sweep" in a.name for a in n.names)]
    assert ours == []

"""The house's rules: no file of code over 500 lines, and no import cycle among the package's modules, counting the
imports made only for type hints (those inside functions are made on use, and are left out)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specasr"
CODE = [*ROOT.glob("*.py"), *(ROOT / "app_pages").glob("*.py"), *PACKAGE.rglob("*.py")]
CODE += [*(ROOT / "scripts").glob("*.py"), *(ROOT / "tools").glob("*.py"), *(ROOT / "tests").glob("*.py")]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def top_level_imports(path: Path) -> set[str]:
    """The package's modules that `path` imports outside its functions (under `if TYPE_CHECKING:` too)."""
    found = set()
    scopes = [ast.parse(path.read_text())]
    while scopes:
        for node in ast.iter_child_nodes(scopes.pop()):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
            elif isinstance(node, ast.If | ast.Try | ast.ClassDef | ast.With):
                scopes.append(node)
    return {name for name in found if name in MODULES and name != module_name(path)}


def cycle_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    """An import path that leads from `start` back to it, if any (depth first)."""
    paths, seen = [[start]], set()
    while paths:
        path = paths.pop()
        for imported in sorted(graph[path[-1]]):
            if imported == start:
                return [*path, start]
            if imported not in seen:
                seen.add(imported)
                paths.append([*path, imported])
    return None


def test_no_file_of_code_is_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in CODE if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}


def test_no_import_cycle_runs_through_the_package_type_hints_included():
    graph = {name: top_level_imports(path) for name, path in MODULES.items()}
    graph["specasr"] = set()  # the package's own imports: its lazy exports import on use
    cycles = {name: cycle for name in graph if (cycle := cycle_from(name, graph))}
    assert cycles == {}


def test_the_walk_sees_imports_made_for_type_hints_only():
    assert "specasr.store" in top_level_imports(PACKAGE / "stored_metrics.py")

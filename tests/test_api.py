"""The public API: `import specasr` is cheap and names what the faces use; the faces import nothing else of ours."""

import ast
import pkgutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

import specasr

ROOT = Path(__file__).resolve().parents[1]
FACES = [ROOT / "app.py", ROOT / "widgets.py", ROOT / "player.py", ROOT / "progress.py", *ROOT.glob("app_pages/*.py")]
FACE_MODULES = {"widgets", "progress", "player", "app_pages"}
OURS_ALLOWED = {"specasr", "specasr.views"}


def imports(tree: ast.Module) -> list[tuple[str, list[str]]]:
    """Every import statement of a module, nested ones included: (module, names imported from it)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", [alias.name for alias in node.names]))
    return found


def test_the_faces_are_found():
    assert len(FACES) >= 12 and all(face.is_file() for face in FACES)


@pytest.mark.parametrize("face", FACES, ids=lambda path: str(path.relative_to(ROOT)))
def test_a_face_imports_only_the_public_api_and_views(face):
    tree = ast.parse(face.read_text())
    for module, names in imports(tree):
        top = module.split(".")[0]
        if module in OURS_ALLOWED or top in FACE_MODULES:
            if module == "specasr":
                assert set(names) <= set(specasr.__all__), f"{face.name}: from specasr import {names}"
            continue
        assert top != "specasr", f"{face.name} imports {module}: only specasr and specasr.views"
        assert top != "torch", f"{face.name} imports torch"
        assert top in sys.stdlib_module_names or find_spec(top), f"{face.name} imports {module}, found nowhere"
    read = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "specasr"}
    assert read <= {*specasr.__all__, "views"}, f"{face.name} reads specasr.{read}"


def test_importing_specasr_imports_no_torch():
    code = "import sys, specasr; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]"


def test_views_imports_no_torch():
    code = "import sys, specasr.views; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "False"


def test_every_public_name_resolves():
    missing = [name for name in specasr.__all__ if getattr(specasr, name, None) is None]
    assert missing == [] and len(set(specasr.__all__)) == len(specasr.__all__)
    assert set(specasr.__all__) <= set(dir(specasr))


def test_a_public_name_is_no_module_of_the_package_but_the_one_exported_whole():
    # importing a submodule binds its name on the package, over a function of the same name
    modules = {module.name for module in pkgutil.iter_modules(specasr.__path__)}
    assert modules & set(specasr.__all__) == {"clipset"}


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'windows_policy'"):
        _ = specasr.windows_policy


def test_every_user_error_is_public_and_told_by_the_dashboard():
    import widgets

    exported = {getattr(specasr, name) for name in specasr.__all__ if name.endswith("Error")}
    assert set(specasr.USER_ERRORS) - {FileNotFoundError} <= exported
    assert set(specasr.USER_ERRORS) <= set(widgets.DECODE_ERRORS)


def test_the_window_names_are_those_settings_accept():
    assert set(specasr.REFERENCE_WINDOWS) | set(specasr.RUNTIME_WINDOWS) < set(specasr.WINDOWS)
    for window in specasr.WINDOWS:
        assert specasr.Settings(window=window).window == window
    with pytest.raises(specasr.SettingsError, match="unknown window"):
        specasr.Settings(window="nowhere")

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_exactly_the_readme_test_command():
    command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    readme = (ROOT / "README.md").read_text()
    assert f"```bash\n{command}\n```" in readme
    assert "streamlit run app.py" in readme


def _layout() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme[readme.index("## Layout") :]


def _modules() -> list[Path]:
    return [
        path
        for path in [*(ROOT / "specasr").glob("*.py"), *(ROOT / "specasr" / "cli").glob("*.py")]
        if path.name not in ("__init__.py", "__main__.py")
    ]


def test_the_module_map_names_every_module_of_the_package():
    layout = _layout()
    missing = [path.name for path in _modules() if path.parent.name == "specasr" and path.name not in layout]
    assert missing == [] and "cli/" in layout


def test_no_module_is_over_500_lines():
    long = {path.name: n for path in _modules() if (n := len(path.read_text().splitlines())) > 500}
    assert long == {}


def test_the_compiled_steps_tables_are_regenerated_from_their_stored_outputs():
    from scripts.compile_tables import decode_table, step_table

    readme = (ROOT / "README.md").read_text()
    assert decode_table() in readme and step_table() in readme

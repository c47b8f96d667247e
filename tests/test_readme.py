import re
from pathlib import Path

import pytest

from scripts.tables import BLOCK, DOCUMENTS, TABLES, regenerated, slug
from specasr.dataset import DEFAULT_SPEECH_DIR

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DESCRIPTIVE_TABLES = (
    '| family | audio memory the draft attends | frame | "audio attention" of a step | checked on |',
    "| term | meaning | where |",
)


def test_ci_runs_exactly_the_readme_test_command():
    command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    readme = README.read_text()
    assert f"```bash\n{command}\n```" in readme
    assert "streamlit run app.py" in readme


def test_the_readme_is_read_in_five_minutes():
    assert len(README.read_text().splitlines()) <= 250


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_every_link_of_the_documents_leads_to_a_file_and_heading_that_exist(document):
    for link, anchor in re.findall(r"\]\(([^)#]+)(?:#([^)]*))?\)", document.read_text()):
        if link.startswith("http"):
            continue
        found = document.parent / link
        assert found.exists(), link
        if anchor:
            headings = re.findall(r"^#+ (.+)$", found.read_text(), re.M)
            assert anchor in {slug(heading) for heading in headings}, f"{link}#{anchor}"


def test_the_readme_python_example_runs(monkeypatch, capsys):
    if not (DEFAULT_SPEECH_DIR / "manifest.tsv").is_file():
        pytest.skip(f"shared speech data not found at {DEFAULT_SPEECH_DIR}")
    example = re.search(r"```python\n(.*?)```", README.read_text(), re.S)[1]
    monkeypatch.chdir(ROOT)
    exec(compile(example, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "same as greedy: True" in printed and re.search(r"L = \d\.\d\d, decode \d+\.\d\dx", printed)


def test_the_architecture_names_every_module_of_the_package_and_the_dashboard():
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    modules = [*(ROOT / "specasr").glob("*.py"), *ROOT.glob("*.py")]
    missing = [path.name for path in modules if path.name not in architecture and path.name != "__main__.py"]
    assert missing == [] and "cli/" in architecture and "app_pages/" in architecture


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_every_table_is_regenerated_from_its_stored_output(document):
    text = document.read_text()
    assert regenerated(text) == text, f"python -m scripts.tables rewrites {document.name}"
    lines = BLOCK.sub("", text).splitlines()
    headers = [line for line, before in zip(lines, ["", *lines[:-1]], strict=True) if line.startswith("|") and not
               before.startswith("|")]  # fmt: skip
    assert [h for h in headers if h not in DESCRIPTIVE_TABLES] == []  # tables outside blocks hold no figures


def test_every_table_the_script_knows_stands_in_a_document():
    named = {match["name"] for document in DOCUMENTS for match in BLOCK.finditer(document.read_text())}
    assert named == set(TABLES)

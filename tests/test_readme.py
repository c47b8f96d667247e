from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_exactly_the_readme_test_command():
    command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    readme = (ROOT / "README.md").read_text()
    assert f"```bash\n{command}\n```" in readme
    assert "streamlit run app.py" in readme

"""Every command the README shows runs as written (in a scratch folder) and exits 0."""
import re
import shlex
from pathlib import Path

import pytest

from opfuse.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_commands() -> list[str]:
    text = README.read_text()
    block = text.split("### Command line", 1)[1].split("```", 2)[1]
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines() if line.startswith("opfuse ")]


def test_readme_lists_commands():
    assert len(readme_commands()) >= 10


@pytest.mark.parametrize("index", range(len(readme_commands())))
def test_readme_command_runs(index, tmp_path_factory, monkeypatch, capsys):
    # One scratch folder for all of them: later commands use files earlier ones wrote.
    work = tmp_path_factory.getbasetemp() / "readme_cwd"
    work.mkdir(exist_ok=True)
    monkeypatch.chdir(work)
    if "--fit" in readme_commands()[index] or "--calibrate" in readme_commands()[index]:
        monkeypatch.setenv("OPFUSE_CACHE_DIR", str(work / "cache"))  # keep the session's host profile nominal
    argv = shlex.split(readme_commands()[index])[1:]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, f"{readme_commands()[index]}\n{err}"

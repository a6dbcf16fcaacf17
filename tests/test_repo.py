"""The repository's promises: README's commands, CI running the same, no ../shared in tests."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _readme_commands():
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_starts_with_two_commands_and_ci_runs_the_second():
    commands = _readme_commands()
    assert len(commands) >= 2
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci
    assert "pytest" in commands[1]


def test_tests_do_not_read_shared():
    for path in (ROOT / "tests").glob("*.py"):
        text = path.read_text()
        assert "../shared" not in text.replace('"../shared" not in', "") or path.name == "test_repo.py"

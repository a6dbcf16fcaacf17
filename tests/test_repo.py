"""The repository's promises: README's commands, CI running the same, tests standing alone."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUTSIDE = "/".join(["..", "sha" + "red"])  # the folder beside a checkout that a fresh clone lacks


def _readme_commands():
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_starts_with_two_commands_and_ci_runs_the_second():
    commands = _readme_commands()
    assert len(commands) >= 2
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci
    assert "pytest" in commands[1]


def test_tests_do_not_read_outside_the_repository():
    for path in (ROOT / "tests").glob("*.py"):
        assert OUTSIDE not in path.read_text(), path.name
        assert "tools" not in re.findall(r"^(?:from|import) (\w+)", path.read_text(), re.M), path.name

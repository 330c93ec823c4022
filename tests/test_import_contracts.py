"""The import contracts of pyproject.toml hold, and each one fails the build when broken.

Each case copies the project's Python files to a scratch folder, adds one throwaway module that
imports the wrong way, and runs lint-imports there: the contract it breaks must be reported
broken, naming the module, and lint-imports must exit non-zero (so `make test` fails).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BASE_DIR = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = ("evalsite", "experiments_app", "runs_app")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("contracts")
    for package in PACKAGES:
        shutil.copytree(
            BASE_DIR / package,
            copy / package,
            ignore=lambda folder, names: [
                name for name in names if not name.endswith(".py") and not (Path(folder) / name).is_dir()
            ],
        )
    shutil.copy(BASE_DIR / "pyproject.toml", copy / "pyproject.toml")
    return copy


def lint_imports(folder: Path) -> subprocess.CompletedProcess:
    # Wide, so the report never wraps a contract's name.
    env = {**os.environ, "COLUMNS": "300"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=folder, capture_output=True, text=True, timeout=120, env=env
    )


def test_the_project_keeps_every_contract(project):
    result = lint_imports(project)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


PURE = "the pure rooms never import Django"
INDEPENDENT = "the engine's rooms are independent"
LAYERED = "runs_app is layered"


@pytest.mark.parametrize(
    ("edits", "contract"),
    [
        (
            {"experiments_app/probe.py": "from runs_app.models import Run\n"},
            "experiments_app never imports runs_app",
        ),
        # Hidden inside a function, as the old cross-app imports were: still found.
        ({"experiments_app/specs/probe.py": "def later():\n    from django.conf import settings\n"}, PURE),
        ({"runs_app/engine/criteria/probe.py": "import django.db\n"}, PURE),
        # Indirectly: a pure module importing the models, which import Django.
        ({"runs_app/analysis/stats/intervals.py": "+from runs_app.models import Trial\n"}, PURE),
        ({"runs_app/engine/sandbox/probe.py": "from django.conf import settings\n"}, PURE),
        # A room of the engine reaching into another: the grader into the gateway, the sandbox
        # into the agents.
        ({"runs_app/engine/criteria/probe.py": "from runs_app.engine.gateway import roles\n"}, INDEPENDENT),
        ({"runs_app/engine/sandbox/probe.py": "from runs_app.engine.agents import base\n"}, INDEPENDENT),
        ({"runs_app/engine/probe.py": "from runs_app import control\n"}, LAYERED),
        ({"runs_app/analysis/probe.py": "from runs_app.web import runs\n"}, LAYERED),
        ({"runs_app/models.py": "+from runs_app.engine import runner\n"}, LAYERED),
    ],
)
def test_a_module_importing_the_wrong_way_breaks_its_contract(project, edits, contract):
    """`edits` maps a file to its new content ("+..." appends to the file)."""
    originals = {}
    for name, text in edits.items():
        path = project / name
        originals[path] = path.read_text() if path.exists() else None
        path.write_text((originals[path] or "") + text[1:] if text.startswith("+") else text)
    try:
        result = lint_imports(project)
    finally:
        for path, text in originals.items():
            path.unlink() if text is None else path.write_text(text)

    assert result.returncode != 0
    broken = [line for line in result.stdout.splitlines() if line.endswith("BROKEN")]
    assert len(broken) == 1 and broken[0].startswith(contract), result.stdout

"""Create the project's virtualenv, even where Debian's python3-venv (ensurepip) is missing.

Usage: python3 scripts/bootstrap_venv.py .venv
"""

import json
import subprocess
import sys
import tempfile
import urllib.request
import venv
from pathlib import Path


def main(target: Path) -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 - the check is for older interpreters running this script
        sys.exit(f"evalsite needs Python 3.11 or newer; {sys.executable} is {sys.version.split()[0]}")
    try:
        venv.EnvBuilder(with_pip=True).create(target)
        return
    except (subprocess.CalledProcessError, OSError) as exc:
        print(f"venv with pip failed ({exc}); installing pip from PyPI instead", file=sys.stderr)
    venv.EnvBuilder(with_pip=False, clear=True).create(target)
    # No ensurepip: fetch pip's wheel from PyPI and let it install itself.
    with urllib.request.urlopen("https://pypi.org/pypi/pip/json", timeout=60) as response:
        release = json.load(response)
    wheel = next(f for f in release["urls"] if f["filename"].endswith(".whl"))
    with tempfile.TemporaryDirectory() as tmp:
        wheel_path = Path(tmp) / wheel["filename"]
        urllib.request.urlretrieve(wheel["url"], wheel_path)
        python = target / "bin" / "python"
        subprocess.run([python, f"{wheel_path}/pip", "install", "-q", str(wheel_path)], check=True)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ".venv"))

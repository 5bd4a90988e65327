"""Which Pythons can install this environment from wheels: for each package pinned in .venv (`pip freeze`), does
PyPI publish, at that very version, a wheel that CPython 3.X on x86-64 Linux installs? The README's Python range
comes from this (CI runs 3.11 alone).

    .venv/bin/python scripts/python_wheels.py 3.10 3.12 3.13 3.14
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def installs_on(filename: str, minor: int) -> bool:
    """A wheel CPython 3.<minor> on x86-64 Linux takes: pure Python 3, cp3<minor>, or abi3 built at or below it."""
    if not filename.endswith(".whl"):
        return False
    python, abi, platform = filename[:-4].split("-")[-3:]
    if platform != "any" and not ("x86_64" in platform and "linux" in platform):
        return False
    for tag in python.split("."):
        built = re.fullmatch(r"cp3(\d+)", tag)
        if tag in ("py3", f"py3{minor}") or (built and (int(built[1]) == minor or abi == "abi3" and int(built[1]) < minor)):
            return True
    return False


def wheels(name: str, version: str) -> list[str]:
    request = urllib.request.Request(
        f"https://pypi.org/simple/{normalized(name).replace('_', '-')}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        files = [f["filename"] for f in json.load(reply)["files"]]
    prefix = f"{normalized(name)}_{normalized(version)}_"
    return [f for f in files if normalized(f).startswith(prefix) and f.endswith(".whl")]


def main() -> int:
    minors = [int(v.split(".")[1]) for v in sys.argv[1:]] or [12, 13, 14]
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True, check=True
    ).stdout.split()
    pins = [line.split("==") for line in frozen if "==" in line]
    with ThreadPoolExecutor(8) as pool:
        found = dict(zip((n for n, _ in pins), pool.map(lambda pin: wheels(pin[0], pin[1].split("+")[0]), pins)))
    for minor in minors:
        missing = [f"{n}=={v}" for n, v in pins if not any(installs_on(f, minor) for f in found[n])]
        verdict = "every package has a wheel" if not missing else f"no wheel for {len(missing)}: {', '.join(missing)}"
        print(f"Python 3.{minor}: {len(pins)} packages; {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

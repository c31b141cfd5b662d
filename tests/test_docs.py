"""The README documents every environment variable lazytpu reads."""

from __future__ import annotations

import re
from pathlib import Path

import lazytpu  # noqa: F401
from lazytpu import _config

ROOT = Path(__file__).resolve().parent.parent


def test_every_env_var_is_in_the_readme_table():
    readme = (ROOT / "README.md").read_text()
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", readme, flags=re.M))
    read_by_code = {flag.env for flag in _config.FLAGS}
    assert read_by_code <= documented, read_by_code - documented


def test_code_reads_env_only_through_flags():
    pattern = re.compile(r"os\.environ(?:\.get)?\s*[\[(]\s*[\"'](LAZYTPU_\w+|TORCH\w*)")
    for path in (ROOT / "lazytpu").rglob("*.py"):
        assert not pattern.search(path.read_text()), f"{path} reads an env var directly; declare a Flag"

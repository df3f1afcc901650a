"""docs/architecture.md names every module of the package: a module is named in its package's entry
(the bullet that starts with its package, e.g. ``- **`sim/`**``) or by its path from the package root
(``sim/twin.py``) anywhere in the page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "simulator"
DOC = ROOT / "docs" / "architecture.md"


def package_entries(text: str) -> dict[str, str]:
    """Each top-level bullet of the page by the package or module it opens with (``sim/``, ``quick.py``)."""
    entries: dict[str, str] = {}
    for bullet in re.split(r"\n(?=- \*\*)", text):
        opened = re.match(r"- \*\*`([^`]+)`\*\*", bullet)
        if opened:
            entries[opened.group(1)] = bullet
    return entries


def unnamed_modules() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    entries = package_entries(text)
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if path.name == "__init__.py" and len(rel.parts) > 1:
            rel = rel.parent  # a package is named as itself
        name = rel.as_posix() + ("/" if rel.suffix != ".py" else "")
        if name in ("__init__.py", "__main__.py") or name in text:
            continue
        top = rel.parts[0] + "/" if len(rel.parts) > 1 else None
        own = "/".join(rel.parts[1:]) + ("/" if rel.suffix != ".py" else "")
        if top is not None and own in entries.get(top, ""):
            continue
        missing.append(name)
    return missing


def test_the_architecture_page_names_every_module():
    assert unnamed_modules() == []

"""The README's ```python blocks, for the tests that run them as written (tests/integrations/test_readme.py
says which test runs each)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent.parent / "README.md"


def python_blocks() -> list[str]:
    """The README's ```python blocks, in order."""
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.M | re.S)


def readme_block(marker: str) -> str:
    """The one ```python block of README.md that contains ``marker``."""
    found = [code for code in python_blocks() if marker in code]
    assert len(found) == 1, f"{len(found)} README blocks contain {marker!r}"
    return found[0]

"""The README's commands and blocks as the tests read them (tests/test_readme.py checks each has a test; the e2e
runs some)."""

from __future__ import annotations

import re

from .conftest import REPO

README = REPO / "README.md"


def readme_blocks(text: str | None = None) -> list[tuple[str, list[str]]]:
    """(command, the sample output lines under it) of every ```bash block: a `# ...` line after a command is its
    output; a trailing `  # ...` is a comment."""
    text = README.read_text() if text is None else text
    out: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                assert out, f"sample output before any command: {line}"
                out[-1][1].append(line[1:].strip())
            else:
                out.append((re.sub(r"\s{2,}#.*$", "", line).strip(), []))
    return out


def readme_command(start: str) -> str:
    """The one README command that starts with `start` (for tests that run it elsewhere)."""
    found = [c for c, _ in readme_blocks() if c.startswith(start)]
    assert len(found) == 1, (start, found)
    return found[0]


def readme_yaml(name: str) -> str:
    """The README's ```yaml block that starts with `# {name}`."""
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S) if b.startswith(f"# {name}")]
    return block

"""Words that point elsewhere must point somewhere: every repository path a config file's or profile's comments name
exists, no config file says it is merged over the demo config (a --configfile replaces it), and each key the README
says to set in a config file is in that file (issue 56's stale words)."""

from __future__ import annotations

import re

import yaml

from .conftest import REPO

COMMENTED = sorted([*REPO.glob("config/*.yaml"), *REPO.glob("cluster/*/*.yaml")])
PATH = re.compile(r"(?<![\w/.-])((?:workflow|docs|config|cluster|benchmarks|tests|envs)/[\w./-]*\w|[A-Z][A-Z_]+\.md)")


def test_paths_named_in_config_comments_exist():
    missing = []
    for f in COMMENTED:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            comment = line.split("#", 1)[1] if "#" in line else ""
            for path in PATH.findall(comment):
                if "*" in path or "{" in path:
                    continue
                if not ((REPO / path).exists() or (REPO / "docs" / path).exists()):
                    missing.append(f"{f.relative_to(REPO)}:{n}: {path}")
    assert not missing, missing


def test_no_config_claims_to_be_merged_over_the_demo():
    said = [f.name for f in COMMENTED if re.search(r"(?<!not )merged over config/config\.yaml", f.read_text(), re.I)]
    assert not said, said


def test_keys_the_readme_says_to_set_are_in_their_file():
    text = (REPO / "README.md").read_text().replace("\n", " ")
    checked = 0
    for m in re.finditer(r"in `(config/[\w.-]+\.yaml)`", text):
        sentence = text[text.rfind(". ", 0, m.start()) + 1 : m.end()]
        data = yaml.safe_load((REPO / m.group(1)).read_text())
        for key in re.findall(r"`([a-z_]+(?:\.[a-z_]+)+)`", sentence):
            node = data
            for part in key.split("."):
                assert isinstance(node, dict) and part in node, f"README: `{key}` is not in {m.group(1)}"
                node = node[part]
            checked += 1
    assert checked >= 2  # corpus.files and glue.data_dir in config/budget-24h.yaml

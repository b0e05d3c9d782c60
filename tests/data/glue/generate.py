"""Writes tiny GLUE-format tasks (the standard TSV layout and column names) for the budget stage's tests.

MNLI (3 classes, dev matched + mismatched), RTE (2 classes), MRPC (2 classes, F1), STS-B (regression):
a few dozen rows each, from the grammar of tests/data/corpus/generate.py. Deterministic.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path


def _grammar():
    """The word lists of tests/data/corpus/generate.py: both data sets speak the same small language."""
    spec = importlib.util.spec_from_file_location("corpus_generate", Path(__file__).parents[1] / "corpus/generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_G = _grammar()
ADJ, NOUN, VERB = _G.ADJ, _G.NOUN, _G.VERB
SIZES = {"train": 48, "dev": 24}


def triple(rng):
    return rng.choice(ADJ), rng.choice(NOUN), rng.choice(VERB), rng.choice(NOUN)


def pair(rng, label):
    """(premise, hypothesis) for label 0 entailment, 1 contradiction-like change, 2 neutral."""
    a, n1, v, n2 = triple(rng)
    s1 = f"The {a} {n1} {v} the {n2}."
    if label == 0:
        return s1, f"The {n1} {v} the {n2}."
    if label == 1:
        return s1, f"The {a} {n1} {v} the {rng.choice([n for n in NOUN if n != n2])}."
    return s1, f"The {rng.choice(NOUN)} {rng.choice(VERB)} a {rng.choice(ADJ)} {rng.choice(NOUN)}."


def write(path: Path, header: list[str] | None, rows: list[list[str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (["\t".join(header)] if header else []) + ["\t".join(map(str, r)) for r in rows]
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    rng = random.Random(1)
    here = Path(__file__).resolve().parent
    mnli_labels = ["entailment", "contradiction", "neutral"]
    mnli_head = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                 "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]  # fmt: skip
    for split in ("train", "dev_matched", "dev_mismatched"):
        rows = []
        for i in range(SIZES["train"] if split == "train" else SIZES["dev"]):
            y = rng.randrange(3)
            s1, s2 = pair(rng, y)
            rows.append([i, i, f"{i}e", "fiction", "-", "-", "-", "-", s1, s2, mnli_labels[y], mnli_labels[y]])
        write(here / "MNLI" / f"{split}.tsv", mnli_head, rows)
    for split, n in SIZES.items():
        rows = []
        for i in range(n):
            y = rng.randrange(2)
            s1, s2 = pair(rng, y)
            rows.append([i, s1, s2, ["entailment", "not_entailment"][y]])
        write(here / "RTE" / f"{split}.tsv", ["index", "sentence1", "sentence2", "label"], rows)
        rows = []
        for i in range(n):
            y = rng.randrange(2)
            s1, s2 = pair(rng, 0 if y else 2)
            rows.append([y, 2 * i, 2 * i + 1, s1, s2])
        write(here / "MRPC" / f"{split}.tsv", ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"], rows)
        rows = []
        for i in range(n):
            s1, s2 = pair(rng, rng.randrange(3))
            w1, w2 = set(s1.lower().strip(".").split()), set(s2.lower().strip(".").split())
            score = round(5 * len(w1 & w2) / len(w1 | w2), 3)
            rows.append([i, "main-captions", "MSRvid", "2012test", i, "none", "none", s1, s2, score])
        head = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2",
                "score"]  # fmt: skip
        write(here / "STS-B" / f"{split}.tsv", head, rows)


if __name__ == "__main__":
    main()

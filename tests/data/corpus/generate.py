"""Writes the small shipped corpus (one document per line) for the budget stage's tests and tiny config.

Deterministic: `python tests/data/corpus/generate.py` rewrites the same files. Sentences come from a
small grammar (tests/data/glue/generate.py builds its tasks from the same words).
"""

from __future__ import annotations

import random
from pathlib import Path

ADJ = [
    "red",
    "blue",
    "green",
    "old",
    "young",
    "small",
    "large",
    "quiet",
    "loud",
    "happy",
    "tired",
    "bright",
    "dark",
    "clever",
    "brave",
]
NOUN = [
    "cat",
    "dog",
    "bird",
    "horse",
    "farmer",
    "teacher",
    "child",
    "doctor",
    "river",
    "garden",
    "house",
    "city",
    "forest",
    "king",
    "queen",
    "boat",
]
VERB = ["sees", "finds", "likes", "follows", "helps", "watches", "carries", "paints", "visits", "remembers"]
PLACE = ["market", "school", "bridge", "castle", "village", "harbour", "library", "station", "mountain", "valley"]
ADV = ["slowly", "quickly", "quietly", "happily", "carefully", "often", "rarely"]


def sentence(rng: random.Random) -> str:
    a, n1, v, n2 = rng.choice(ADJ), rng.choice(NOUN), rng.choice(VERB), rng.choice(NOUN)
    form = rng.randrange(4)
    if form == 0:
        return f"The {a} {n1} {v} the {n2}."
    if form == 1:
        return f"The {a} {n1} {v} the {n2} near the {rng.choice(PLACE)}."
    if form == 2:
        return f"Every day the {n1} {rng.choice(ADV)} {v} a {a} {n2}."
    return f"In the {rng.choice(PLACE)}, a {n1} {v} the {a} {n2} and the {rng.choice(NOUN)}."


def document(rng: random.Random) -> str:
    return " ".join(sentence(rng) for _ in range(rng.randint(3, 12)))


def main() -> None:
    rng = random.Random(0)
    here = Path(__file__).resolve().parent
    for part, n_docs in (("part-000.txt", 200), ("part-001.txt", 150)):
        (here / part).write_text("".join(document(rng) + "\n" for _ in range(n_docs)))


if __name__ == "__main__":
    main()

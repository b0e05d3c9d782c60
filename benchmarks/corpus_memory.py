"""Peak resident memory of the train stage's data at two corpus sizes (issue 54): tokenizing a text corpus into
token shards (trainer/data/tokens.py) and training tiny-gptneox on them (train/run.py, reading memmapped blocks),
each in a fresh process; the larger corpus's peaks should be within 1.2x of the smaller's (memory does not grow
with the corpus).

    nice .venv/bin/python benchmarks/corpus_memory.py --sizes-mb 10 1000 --workers 2

Writes benchmarks/results/corpus_memory.md. The corpus is made-up words (one document per line, like the
generated corpus); the tokenizer a byte-level BPE of 512 tokens trained on its first MB, given to the run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow"))
sys.path.insert(0, str(REPO))
from pretrain_planner.tables import markdown  # noqa: E402

# The process's own peak: VmHWM (reset by exec), not getrusage's ru_maxrss, which Linux carries over from the forking
# parent (this script, with its imports: a floor of ~300 MB seen in a first run). Workers: getrusage of the children
# (spawned by the small tokenizing process, so their floor is its size at that time).
PEAK = """
def peak_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
"""

MEASURE_TOKENIZE = (
    PEAK
    + """
import json, resource, sys, time
from pathlib import Path
from pretrain_planner.planning.corpus import check_train_data
from pretrain_planner.trainer.data import tokens
model, data, tok, data_dir, workers = json.loads(sys.argv[1])
t0 = time.monotonic()
info = check_train_data(model, data, None, None, tok)
files, dtype, man = tokens.tokenize_corpus(info, 512, Path(data_dir), workers=workers)
print(json.dumps({"tokens": man["tokens"], "shards": len(files), "seconds": time.monotonic() - t0,
                  "self_mb": peak_mb(), "workers_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""
)

MEASURE_TRAIN = (
    PEAK
    + """
import json, resource, sys, time
from pretrain_planner.train.run import train_plan
plan, out, data, tok, steps = json.loads(sys.argv[1])
t0 = time.monotonic()
res = train_plan(plan, out=out, steps=steps, data=data, tokenizer=tok, threads=1, warmup_steps=1,
                 checkpoint_every_min=None)
print(json.dumps({"steps": res["steps"], "blocks": res["data"]["blocks"], "seconds": time.monotonic() - t0,
                  "self_mb": peak_mb()}))
"""
)


def make_corpus(path: Path, mb: int, seed: int = 0) -> Path:
    """`mb` MB of made-up words, one document of 40-400 words a line: a 4 MB block of sampled lines, written again
    in a fresh line order until the size is reached (the memory of tokenizing does not depend on the words)."""
    import numpy as np

    if path.is_file() and path.stat().st_size >= mb << 20:
        return path
    rng = np.random.default_rng(seed)
    syll = ["ka", "lo", "mi", "nu", "ter", "sa", "vo", "ri", "pe", "dun", "ax", "el", "or", "ti", "qua", "zen"]
    words = np.array(sorted({"".join(rng.choice(syll, size=rng.integers(1, 4))) for _ in range(3000)}))
    p = 1.0 / np.arange(1, len(words) + 1)
    p /= p.sum()
    sampled = words[rng.choice(len(words), size=700_000, p=p)].tolist()
    cuts = np.cumsum(rng.integers(40, 400, size=len(sampled) // 40)).tolist()
    lines = [" ".join(sampled[a:b]) for a, b in zip([0, *cuts[:-1]], cuts, strict=False) if b <= len(sampled)]
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(path, "w") as fh:
        while written < mb << 20:
            chunk = "\n".join(lines[i] for i in rng.permutation(len(lines))) + "\n"
            fh.write(chunk)
            written += len(chunk)
    return path


def make_tokenizer(corpus: Path, out: Path) -> Path:
    """A 512-token byte-level BPE trained on the corpus's first MiB of lines (the trainer's own BPE)."""
    from pretrain_planner.trainer.data.tokens import byte_level_bpe

    with open(corpus) as fh:
        head = fh.readlines(1 << 20)
    return byte_level_bpe(head, 512, out)


def run(code: str, arg: list) -> dict:
    env = {"PYTHONPATH": str(REPO / "workflow"), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "PATH": "/usr/bin:/bin"}  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(arg)], capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes-mb", type=int, nargs=2, default=[10, 1000])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--work", default="/tmp/pp-corpus-memory")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/corpus_memory.md"))
    a = ap.parse_args()
    from pretrain_planner.planning.catalog import load_catalog

    from tests.conftest import write_plan

    work = Path(a.work)
    model = load_catalog(REPO / "config/models.yaml", REPO / "config/gpus.yaml").model("tiny-gptneox").to_dict()
    plan = write_plan(work / "plan", "tiny-gptneox")
    rows = []
    tok = None
    for mb in a.sizes_mb:
        t0 = time.monotonic()
        corpus = make_corpus(work / f"corpus-{mb}mb" / "corpus.txt", mb)
        made = time.monotonic() - t0
        tok = tok or make_tokenizer(corpus, work / "tokenizer.json")
        out = work / f"train-{mb}mb"
        t = run(MEASURE_TOKENIZE, [model, str(corpus), str(tok), str(out / "data"), a.workers])
        r = run(MEASURE_TRAIN, [str(plan), str(out), str(corpus), str(tok), a.steps])
        t["peak_mb"] = max(t["self_mb"], t["workers_mb"])  # one piece: tokenized in the parent, no worker
        rows.append({"mb": corpus.stat().st_size / 2**20, "made_s": made, **{f"tok_{k}": v for k, v in t.items()},
                     **{f"train_{k}": v for k, v in r.items()}})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    small, large = rows
    ratio = {k: large[k] / small[k] for k in ("tok_peak_mb", "train_self_mb")}
    lines = [
        "# Peak resident memory of the train stage's data vs corpus size (benchmarks/corpus_memory.py)",
        "",
        f"tiny-gptneox, a text corpus of made-up words (one document a line), a byte-level BPE of 512 tokens; "
        f"tokenizing with {a.workers} worker process(es) (pieces of 64 MB, trainer/data/tokens.py), then "
        f"{a.steps} training steps reading memmapped blocks (train/run.py), each in a fresh process; peak RSS: the "
        "process's VmHWM, the largest worker's getrusage. Run with `nice` on a shared 2-core host.",
        "",
        *markdown.plain(
            [
                "corpus",
                "tokens",
                "shards",
                "tokenize s",
                "tokenize peak RSS (parent)",
                "tokenize peak RSS (largest worker)",
                "train blocks",
                "train peak RSS",
            ],
            [
                [
                    f"{r['mb']:.0f} MB",
                    f"{r['tok_tokens'] / 1e6:.1f} M",
                    r["tok_shards"],
                    f"{r['tok_seconds']:.0f}",
                    f"{r['tok_self_mb']:.0f} MB",
                    f"{r['tok_workers_mb']:.0f} MB",
                    r["train_blocks"],
                    f"{r['train_self_mb']:.0f} MB",
                ]
                for r in rows
            ],
        ),
    ]
    lines += [
        "",
        f"Larger / smaller: tokenizing (the largest process) {ratio['tok_peak_mb']:.2f}x, training "
        f"{ratio['train_self_mb']:.2f}x (the criterion: within 1.2x). One piece (the smaller corpus) is tokenized "
        "in the parent, no worker (0 MB).",
        "",
    ]
    Path(a.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

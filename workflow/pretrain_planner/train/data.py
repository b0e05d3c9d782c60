"""The train stage's data, per task of the family registry (planning/families.py):

- causal LM (GPT-NeoX/Pythia, Mamba): text files (one document per line) or, without --data, a generated corpus
  (made-up words in Zipf-like frequencies: synthetic text, labelled so); a tokenizer from a local `tokenizers` file
  or a byte-level BPE trained here on the corpus (at most the model's vocabulary); documents joined with the end
  token and packed into blocks of the recipe's sequence length (labels = inputs: the model shifts them).
- masked LM (BERT, RoBERTa): the budget stage's data preparation (budget/data.py: WordPiece, samples of the
  sequence length, static masking) on the same corpus, read by its ShardSampler.
- image classification (ViT, ConvNeXt): a local image folder (one sub-folder per class: .npy arrays HxWxC or CxHxW,
  or image files when Pillow is installed), resized to the recipe's image size; or, without --data, synthetic
  images (seeded noise with a class-dependent pattern, so a model can learn them), labelled as such.

Every source is a global sample stream in a seeded order (`IndexSampler`, or ShardSampler for MLM) whose position
is the checkpoint's `data`; every rank walks the same stream and trains on its own slice of each micro-batch.
"""

from __future__ import annotations

import glob
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pretrain_planner.budget.config import fingerprint

GENERATED_LABEL = "generated corpus (synthetic made-up-word text, not a real data set)"
SYNTHETIC_IMAGES_LABEL = "synthetic images (seeded noise with a class pattern, not a real data set)"
IMAGE_SUFFIXES = (".npy", ".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")


class IndexSampler:
    """Sample indices 0..n-1 in a seeded order, a fresh permutation every epoch; the position (epoch, offset) is
    the checkpoint's."""

    def __init__(self, n: int, seed: int) -> None:
        if n < 1:
            raise ValueError("no samples")
        self.n, self.seed, self.epoch, self.offset = n, seed, 0, 0
        self._perm: tuple[int, np.ndarray] | None = None

    def _order(self) -> np.ndarray:
        if self._perm is None or self._perm[0] != self.epoch:
            self._perm = (self.epoch, np.random.default_rng([self.seed, self.epoch]).permutation(self.n))
        return self._perm[1]

    def take(self, k: int) -> np.ndarray:
        out = []
        while k > 0:
            part = self._order()[self.offset : self.offset + k]
            out.append(part)
            self.offset += len(part)
            k -= len(part)
            if self.offset >= self.n:
                self.epoch, self.offset = self.epoch + 1, 0
        return np.concatenate(out)

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state(self, s: dict[str, int]) -> None:
        self.epoch, self.offset = s["epoch"], s["offset"]


# ---------------------------------------------------------------------------------------------------- text
def generate_corpus(path: Path, seed: int, min_words: int) -> Path:
    """A deterministic text file of made-up words (one document per line, sentences ending in '.'), at least
    `min_words` words."""
    rng = np.random.default_rng([seed, 7])
    syll = ["ka", "lo", "mi", "nu", "ter", "sa", "vo", "ri", "pe", "dun", "ax", "el", "or", "ti", "qua", "zen"]
    words = sorted({"".join(rng.choice(syll, size=rng.integers(1, 4))) for _ in range(3000)})
    p = 1.0 / np.arange(1, len(words) + 1)
    p /= p.sum()
    lines, n = [], 0
    while n < min_words:
        sents = []
        for _ in range(int(rng.integers(3, 12))):
            k = int(rng.integers(4, 16))
            sents.append(" ".join(rng.choice(words, size=k, p=p)).capitalize() + ".")
            n += k
        lines.append(" ".join(sents))
    text = "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:  # kept as it is: a resumed run's data fingerprint holds
        path.write_text(text)
    return path


def text_files(data: str | None, out_dir: Path, seed: int, min_words: int) -> tuple[list[str], dict[str, Any]]:
    """The corpus files (a file, a folder of .txt files or a glob), or a generated corpus; and how to label it."""
    if data is None:
        f = generate_corpus(out_dir / "generated_corpus.txt", seed, min_words)
        return [str(f)], {"source": "generated", "synthetic": True, "label": GENERATED_LABEL, "files": [str(f)]}
    p = Path(data)
    files = sorted(str(x) for x in p.rglob("*.txt")) if p.is_dir() else sorted(glob.glob(data))
    if not files:
        raise FileNotFoundError(f"--data {data}: no text files")
    return files, {"source": "local text", "synthetic": False, "label": f"local text ({len(files)} files)",
                   "files": files}  # fmt: skip


def _train_bpe(files: list[str], vocab_size: int, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from pretrain_planner.budget.data import iter_documents

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(iter_documents(files), trainer)
    tok.save(str(out))
    return tok


def causal_lm_tokens(
    files: list[str], tokenizer: str | None, vocab_size: int, seq_len: int, data_dir: Path
) -> tuple[np.ndarray, dict[str, Any]]:
    """Blocks (n, seq_len) of token ids: the documents joined with the end-of-text token, packed. Cached in
    data_dir (tokens.npy with the fingerprint of the files, tokenizer and sizes)."""
    from tokenizers import Tokenizer

    from pretrain_planner.budget.data import iter_documents

    data_dir.mkdir(parents=True, exist_ok=True)
    fp = fingerprint([(f, Path(f).stat().st_size, Path(f).stat().st_mtime) for f in files], tokenizer, vocab_size,
                     seq_len)  # fmt: skip
    meta_path, tok_path, arr_path = data_dir / "tokens.json", data_dir / "tokenizer.json", data_dir / "tokens.npy"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if meta.get("fingerprint") == fp:
        return np.load(arr_path, mmap_mode="r"), meta
    if tokenizer:
        tok = Tokenizer.from_file(tokenizer)
        how = f"from {tokenizer}"
    else:
        tok = _train_bpe(files, min(vocab_size, 32000), tok_path)
        how = f"byte-level BPE trained on the corpus ({tok.get_vocab_size()} tokens)"
    if tok.get_vocab_size() > vocab_size:
        raise ValueError(f"the tokenizer has {tok.get_vocab_size()} tokens, the model's vocabulary {vocab_size}")
    ends = [tok.token_to_id(t) for t in ("<|endoftext|>", "</s>", "[SEP]", "<eos>")]
    eos = next((i for i in ends if i is not None), None)
    ids: list[int] = []
    docs = list(iter_documents(files))
    for k in range(0, len(docs), 1000):
        for enc in tok.encode_batch(docs[k : k + 1000], add_special_tokens=False):
            ids.extend(enc.ids)
            if eos is not None:
                ids.append(eos)
    n = len(ids) // seq_len
    if n < 1:
        raise ValueError(f"the corpus has {len(ids)} tokens: fewer than one sequence of {seq_len}")
    blocks = np.asarray(ids[: n * seq_len], dtype=np.int32).reshape(n, seq_len)
    np.save(arr_path, blocks)
    meta = {"fingerprint": fp, "tokenizer": how, "tokenizer_vocab": tok.get_vocab_size(), "tokens": len(ids),
            "blocks": n, "seq_len": seq_len,
            "packing": "documents joined with the end token, cut into blocks"}  # fmt: skip
    meta_path.write_text(json.dumps(meta, indent=1))
    return blocks, meta


def mlm_config(files: list[str], tokenizer: str | None, model: dict[str, Any], seed: int) -> dict[str, Any]:
    """budget/data.py's configuration for the model's recipe: WordPiece (at most the model's vocabulary), samples
    of the recipe's sequence length, its masking probability, about that share of positions predicted."""
    from pretrain_planner.schema import section

    r = model["recipe"]
    seq, p = int(r["sequence_length"]), float(r.get("mlm_probability") or 0.15)
    # RoBERTa numbers positions from pad_token_id + 1: leave room
    room = int(model["arch"].get("max_position_embeddings", seq)) - (2 if model["family"].startswith("roberta") else 0)
    tok = {"path": tokenizer, "vocab_size": min(int(model["arch"]["vocab_size"]), 30522)}
    data = {"seq_len": min(seq, room), "mlm_probability": p, "max_predictions": max(1, math.ceil(seq * p)),
            "duplication_factor": 2, "samples_per_shard": 4096}  # fmt: skip
    return {
        "seed": seed,
        "corpus": {"files": files, "validation_fraction": 0.05},
        "tokenizer": section("budget", "tokenizer", tok),
        "data": section("budget", "data", data),
    }


# -------------------------------------------------------------------------------------------------- images
class ImageSource:
    """Images by index: a local folder (class sub-folders) or synthetic ones; (pixel_values, labels) batches."""

    def __init__(self, data: str | None, image_size: int, num_labels: int, seed: int, min_samples: int) -> None:
        self.size, self.num_labels, self.seed = image_size, max(1, num_labels), seed
        if data is None:
            self.files: list[tuple[str, int]] | None = None
            self.n = max(1024, min_samples)
            self.info = {"source": "synthetic", "synthetic": True, "label": SYNTHETIC_IMAGES_LABEL, "images": self.n}
            return
        root = Path(data)
        classes = sorted(d.name for d in root.iterdir() if d.is_dir()) if root.is_dir() else []
        if not classes:
            raise FileNotFoundError(f"--data {data}: not an image folder (one sub-folder per class)")
        self.files = [(str(f), i % self.num_labels) for i, c in enumerate(classes)
                      for f in sorted((root / c).iterdir()) if f.suffix.lower() in IMAGE_SUFFIXES]  # fmt: skip
        if not self.files:
            raise FileNotFoundError(f"--data {data}: no images ({', '.join(IMAGE_SUFFIXES)})")
        self.n = len(self.files)
        self.info = {"source": "image folder", "synthetic": False, "label": f"image folder {data} ({self.n} images, "
                     f"{len(classes)} classes)", "classes": len(classes), "images": self.n}  # fmt: skip
        if len(classes) > self.num_labels:
            self.info["note"] = f"{len(classes)} classes folded onto the model's {self.num_labels} labels (modulo)"

    def _synthetic(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + int(i))
        label = int(torch.randint(0, self.num_labels, (1,), generator=g))
        img = torch.randn(3, self.size, self.size, generator=g)
        stripe = max(1, self.size // self.num_labels)
        img[label % 3, :, (label * stripe) % self.size : (label * stripe) % self.size + stripe] += 2.0
        return img, label

    def _load(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.files[int(i)]
        if path.endswith(".npy"):
            arr = np.load(path)
        else:
            try:
                from PIL import Image
            except ImportError as exc:
                why = f"{path}: reading image files needs Pillow (pip install pillow), or use .npy arrays"
                raise RuntimeError(why) from exc
            arr = np.asarray(Image.open(path).convert("RGB"))
        t = torch.as_tensor(np.asarray(arr, dtype=np.float32))
        if t.ndim == 2:
            t = t.unsqueeze(-1).expand(*t.shape, 3)
        if t.shape[-1] in (1, 3, 4) and t.shape[0] not in (1, 3):
            t = t.permute(2, 0, 1)
        t = t[:3] if t.shape[0] >= 3 else t.expand(3, *t.shape[1:])
        if t.max() > 1.5:
            t = t / 255.0
        t = torch.nn.functional.interpolate(t.unsqueeze(0), size=(self.size, self.size), mode="bilinear",
                                            align_corners=False)[0]  # fmt: skip
        return (t - 0.5) / 0.5, label

    def batch(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        get = self._synthetic if self.files is None else self._load
        items = [get(int(i)) for i in indices]
        return {"pixel_values": torch.stack([x for x, _ in items]), "labels": torch.tensor([y for _, y in items])}

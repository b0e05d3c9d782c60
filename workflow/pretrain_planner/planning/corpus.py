"""What a training corpus is, decided when a run is planned (the CLI, the train rule, a dry run), before any job or
host lock: its kind, its files, its token count where the headers tell it, and the tokenizer it needs. Torch-free and
cheap: it reads headers (a .npy header, a Parquet footer, an Arrow schema, a JSON line), never the corpus.

Kinds (`KINDS`):
- token ids: `.npy` (its own dtype) or raw `.bin` (a dtype given: `train.data_dtype`), a file or a folder of them
  (shards, in name order): read as memmaps, no tokenizer;
- text: `.txt` (one document per line), JSON lines (`.jsonl`/`.json`/`.ndjson`, the text in `train.data_field`),
  Parquet (`.parquet`/`.pq`, a column), a Hugging Face `datasets` folder (`save_to_disk`: Arrow files, a column; a
  `DatasetDict` folder's `train` split): a file or a folder of files of one kind; they need a tokenizer (a
  tokenizer.json, a local Hugging Face tokenizer folder holding one, or `train`: a byte-level BPE trained on the
  corpus, only when asked).

Anything else (an unknown extension, a folder of mixed kinds, an empty folder) is refused with one line naming the
path and what is accepted: a file of an unknown kind is never read as text.
"""

from __future__ import annotations

import glob
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOKEN_DTYPES = ("uint16", "uint32", "int32")  # a raw .bin's element type (what nanoGPT / litgpt / OLMo write)
TEXT_SUFFIXES = (".txt", ".text")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
KIND_OF_SUFFIX = {
    **{s: "text" for s in TEXT_SUFFIXES},
    **{s: "jsonl" for s in JSONL_SUFFIXES},
    **{s: "parquet" for s in PARQUET_SUFFIXES},
    ".arrow": "datasets",
    ".npy": "npy",
    ".bin": "bin",
}
TOKEN_KINDS = ("npy", "bin")
TEXT_KINDS = ("text", "jsonl", "parquet", "datasets")
KINDS = TOKEN_KINDS + TEXT_KINDS
TRAIN_TOKENIZER = "train"  # train.tokenizer / --tokenizer: train a byte-level BPE on the corpus
ACCEPTED = (".npy or .bin token ids, .txt, .jsonl, .parquet, a Hugging Face datasets folder, or a folder of one of "
            "these")  # fmt: skip
IGNORED = ("README", "LICENSE")  # a data folder's prose, not data


@dataclass
class CorpusInfo:
    """A corpus as planned: its kind, files (in order), the text field, the token dtype, the token count when the
    headers tell it (token files) else None, the rows/documents when known, the tokenizer (a tokenizer.json path,
    `train`, or None for token files) and a label for the result."""

    kind: str
    files: list[str]
    path: str
    field: str = "text"
    dtype: str | None = None
    tokens: int | None = None
    documents: int | None = None
    tokenizer: str | None = None

    @property
    def is_tokens(self) -> bool:
        return self.kind in TOKEN_KINDS

    @property
    def format(self) -> str:
        """The format as result.json's data.format names it."""
        if self.kind == "npy":
            return "npy tokens"
        if self.kind == "bin":
            return f"bin tokens ({self.dtype})"
        return self.kind

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "format": self.format, "files": self.files, "path": self.path, "field": self.field,
                "dtype": self.dtype, "tokens": self.tokens, "documents": self.documents,
                "tokenizer": self.tokenizer}  # fmt: skip


def kind_of(path: Path) -> str | None:
    """The kind of one file from its extension, or None (unknown: refused, never read as text)."""
    return KIND_OF_SUFFIX.get(path.suffix.lower())


def _refuse(data: str, why: str) -> ValueError:
    return ValueError(f"train.data / --data {data}: {why}")


def _data_files(data: str) -> tuple[str, list[Path]]:
    """(kind, files) of a path, folder or glob; raises with one line for what cannot be a corpus."""
    p = Path(data)
    if p.is_dir():
        if (p / "state.json").is_file() or (p / "dataset_dict.json").is_file():
            return "datasets", _datasets_files(data, p)
        files = sorted(x for x in p.rglob("*") if x.is_file() and not any(part.startswith(".") for part in
                       x.relative_to(p).parts) and not x.name.upper().startswith(IGNORED))  # fmt: skip
        if not files:
            raise _refuse(data, f"an empty folder (no corpus files; accepted: {ACCEPTED})")
    elif p.is_file():
        files = [p]
    elif any(c in data for c in "*?["):
        files = sorted(Path(x) for x in glob.glob(data, recursive=True) if Path(x).is_file())
        if not files:
            raise _refuse(data, "the glob matches no file")
    else:
        raise _refuse(data, "no such file or folder")
    kinds: dict[str, list[Path]] = {}
    for f in files:
        k = kind_of(f)
        if k is None:
            raise _refuse(data, f"{f.name}: a file of an unknown kind ({f.suffix or 'no extension'}); accepted: "
                                f"{ACCEPTED}")  # fmt: skip
        kinds.setdefault(k, []).append(f)
    if len(kinds) > 1:
        counts = ", ".join(f"{len(v)} {k}" for k, v in sorted(kinds.items()))
        raise _refuse(data, f"files of several kinds ({counts}): a corpus is of one kind")
    (kind, found), = kinds.items()  # fmt: skip
    if kind == "datasets":  # loose .arrow files of a datasets save: their folder is the corpus
        raise _refuse(data, "Arrow files: give the Hugging Face datasets folder (with state.json) instead")
    return kind, found


def _datasets_files(data: str, p: Path) -> list[Path]:
    """The Arrow files of a `save_to_disk` folder (a DatasetDict: its `train` split)."""
    if (p / "dataset_dict.json").is_file():
        splits = json.loads((p / "dataset_dict.json").read_text()).get("splits", [])
        if "train" not in splits:
            raise _refuse(data, f"a datasets DatasetDict without a 'train' split (splits: {', '.join(splits)})")
        p = p / "train"
    try:
        state = json.loads((p / "state.json").read_text())
        files = [p / f["filename"] for f in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _refuse(data, f"{p / 'state.json'} is not a datasets save_to_disk state ({exc})") from None
    missing = [f.name for f in files if not f.is_file()]
    if missing or not files:
        raise _refuse(data, f"a datasets folder missing its Arrow files ({', '.join(missing) or 'none listed'})")
    return files


def _npy_tokens(data: str, f: Path) -> int:
    import numpy as np

    try:
        arr = np.load(f, mmap_mode="r")
    except (ValueError, OSError) as exc:
        raise _refuse(data, f"{f.name} is not a readable .npy array ({exc})") from None
    if arr.dtype.kind not in "iu" or arr.ndim not in (1, 2):
        raise _refuse(data, f"{f.name} holds {arr.dtype} of shape {arr.shape}: token ids are a 1-D (or 2-D blocks) "
                            "integer array")  # fmt: skip
    return int(arr.size)


def _bin_tokens(data: str, f: Path, dtype: str) -> int:
    import numpy as np

    size, item = f.stat().st_size, np.dtype(dtype).itemsize
    if size % item:
        raise _refuse(data, f"{f.name} has {size} bytes, not a whole number of {dtype} ({item} bytes): the wrong "
                            "train.data_dtype?")  # fmt: skip
    return size // item


def _check_field(data: str, kind: str, f: Path, fld: str) -> int | None:
    """The text field is there (a Parquet column, an Arrow column, a JSON line's key); the rows when known."""
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            meta = pq.ParquetFile(f)
        except Exception as exc:  # pyarrow raises several types for a damaged footer
            raise _refuse(data, f"{f.name} is not a readable Parquet file ({type(exc).__name__}: {exc})") from None
        names = meta.schema_arrow.names
        if fld not in names:
            raise _refuse(data, f"{f.name} has no column {fld!r} (train.data_field; columns: {', '.join(names)})")
        return int(meta.metadata.num_rows)
    if kind == "datasets":
        import pyarrow as pa

        try:
            with pa.memory_map(str(f)) as src:
                names = pa.ipc.open_stream(src).schema.names
        except Exception as exc:
            raise _refuse(data, f"{f.name} is not a readable Arrow stream ({type(exc).__name__}: {exc})") from None
        if fld not in names:
            raise _refuse(data, f"{f.name} has no column {fld!r} (train.data_field; columns: {', '.join(names)})")
        return None
    if kind == "jsonl":
        with open(f, encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        rec = json.loads(line)
                    except ValueError as exc:
                        raise _refuse(data, f"{f.name}:{n}: not a JSON line ({exc})") from None
                    if not isinstance(rec, dict) or fld not in rec:
                        keys = ", ".join(rec) if isinstance(rec, dict) else type(rec).__name__
                        raise _refuse(data, f"{f.name}:{n}: no field {fld!r} (train.data_field; has: {keys})")
                    return None
                if n > 1000:
                    break
    return None


def tokenizer_file(tokenizer: str) -> str:
    """The tokenizer.json of `tokenizer` (the file, or a local Hugging Face tokenizer folder holding one); raises
    one line where there is none."""
    p = Path(tokenizer)
    if p.is_dir():
        if (p / "tokenizer.json").is_file():
            return str(p / "tokenizer.json")
        raise ValueError(f"train.tokenizer / --tokenizer {tokenizer}: a folder without tokenizer.json (a fast "
                         "tokenizer's file: AutoTokenizer.from_pretrained(...).save_pretrained writes it)")  # fmt: skip
    if not p.is_file():
        raise ValueError(
            f"train.tokenizer / --tokenizer {tokenizer}: no such file or folder (a tokenizer.json, a "
            f"local Hugging Face tokenizer folder, or {TRAIN_TOKENIZER!r}: a BPE trained on the corpus)"
        )
    try:
        head = json.loads(p.read_text(encoding="utf-8", errors="replace"))
        ok = isinstance(head, dict) and "model" in head
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"train.tokenizer / --tokenizer {tokenizer}: not a tokenizers JSON file (tokenizer.json)")
    return str(p)


def inspect_corpus(
    data: str,
    dtype: str | None = None,
    field: str | None = None,
    tokenizer: str | None = None,
    *,
    text_tokenizer_default: str | None = None,
) -> CorpusInfo:
    """The corpus at `data` (a file, folder or glob) checked from its headers: raises ValueError with one line for
    anything that cannot be read as planned. `text_tokenizer_default`: what a text corpus without a tokenizer gets
    (None: refused, the user names one or asks `train`)."""
    kind, files = _data_files(data)
    info = CorpusInfo(kind, [str(f) for f in files], data, field=field or "text")
    if kind in TOKEN_KINDS:
        given = [n for n, v in (("train.tokenizer / --tokenizer", tokenizer), ("train.data_field / --data-field",
                 field)) if v]  # fmt: skip
        if given:
            raise _refuse(data, f"token ids ({kind}): {' and '.join(given)} apply to text only (leave them out)")
        if kind == "bin":
            if dtype is None:
                raise _refuse(data, f"raw .bin token ids need their dtype: train.data_dtype / --data-dtype (one of "
                                    f"{', '.join(TOKEN_DTYPES)})")  # fmt: skip
            if dtype not in TOKEN_DTYPES:
                raise _refuse(data, f"data dtype {dtype!r} is not one of {', '.join(TOKEN_DTYPES)}")
            info.tokens = sum(_bin_tokens(data, f, dtype) for f in files)
            info.dtype = dtype
        else:
            if dtype is not None:
                raise _refuse(data, "a .npy carries its dtype: train.data_dtype / --data-dtype is for raw .bin only")
            info.tokens = sum(_npy_tokens(data, f) for f in files)
        if info.tokens == 0:
            raise _refuse(data, "no tokens (empty token files)")
        return info
    if dtype is not None:
        raise _refuse(data, f"{kind}: train.data_dtype / --data-dtype is for raw .bin token ids only")
    if kind == "text" and field:
        raise _refuse(data, "text files hold one document per line: train.data_field / --data-field is for jsonl, "
                            "parquet and datasets")  # fmt: skip
    rows = [_check_field(data, kind, f, info.field) for f in files]
    info.documents = sum(r for r in rows if r is not None) if all(r is not None for r in rows) else None
    if all(Path(f).stat().st_size == 0 for f in files):
        raise _refuse(data, "empty files (no documents)")
    tok = tokenizer or text_tokenizer_default
    if tok is None:
        raise _refuse(data, f"{kind} needs a tokenizer: train.tokenizer / --tokenizer (a tokenizer.json or a local "
                            f"Hugging Face tokenizer folder; {TRAIN_TOKENIZER!r}: a byte-level BPE trained on the "
                            "corpus)")  # fmt: skip
    info.tokenizer = tok if tok == TRAIN_TOKENIZER else tokenizer_file(tok)
    return info


def check_vocab(info: CorpusInfo, vocab_size: int, sample: int = 1 << 20) -> int | None:
    """The largest token id on a sample (the first and last `sample` ids of each file) of token files; raises one
    line when it is not below the model's vocabulary. None for text."""
    if not info.is_tokens:
        return None
    import numpy as np

    top = 0
    for f in info.files:
        arr = np.load(f, mmap_mode="r") if info.kind == "npy" else np.memmap(f, dtype=info.dtype, mode="r")
        flat = arr.reshape(-1)
        for part in (flat[:sample], flat[-sample:]):
            if part.size:
                top = max(top, int(part.max()))
                if int(part.min()) < 0:
                    raise _refuse(info.path, f"{Path(f).name}: negative token ids")
    if top >= vocab_size:
        raise _refuse(info.path, f"token id {top} (on a sample) is not below the model's vocabulary {vocab_size}: "
                                 "tokens of another tokenizer?")  # fmt: skip
    return top


def content_fingerprint(
    files: list[str], whole_below: int = 64 << 20, samples: int = 64, chunk: int = 1 << 16, budget: int = 4 << 30
) -> str:
    """A hash of the files' contents in order (not their names or times: a moved or touched corpus is the same
    corpus): a file under `whole_below` bytes entirely, a larger one by its size and `samples` evenly spaced chunks;
    in a corpus over `budget` bytes every file by its samples (at most samples x chunk bytes read per file: cheap
    on a corpus of many GB; an edit that keeps the size and misses every chunk goes unseen)."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    sizes = [Path(f).stat().st_size for f in files]
    whole = whole_below if sum(sizes) <= budget else 0
    for f, size in zip(files, sizes, strict=True):
        h.update(f"{size}:".encode())
        with open(f, "rb") as fh:
            if size < whole or size <= chunk:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            else:
                for k in range(samples):
                    fh.seek((size - chunk) * k // (samples - 1))
                    h.update(fh.read(chunk))
    return h.hexdigest()


def check_train_data(
    model: dict[str, Any], data: str | None, dtype: str | None, field: str | None, tokenizer: str | None
) -> CorpusInfo | None:
    """The train stage's data checked for `model` (a catalog entry's dict: its task, its vocabulary) when the run is
    planned, before any job: a text task's corpus (`inspect_corpus`; a causal LM's token ids below its vocabulary on
    a sample; a masked LM trains its WordPiece unless given one and reads text only). Raises ValueError, one line.
    None where there is nothing to inspect (no data: a generated corpus; an image task: its folder is read by the
    image code)."""
    task = model.get("task")
    if task not in ("causal_lm", "masked_lm"):
        if dtype or field:
            raise ValueError(f"train.data_dtype / train.data_field: for text corpora; {model.get('name')} is {task}")
        return None
    if data is None:
        if dtype or field:
            raise ValueError("train.data_dtype / train.data_field: there is no train.data / --data to apply them to")
        if tokenizer and tokenizer != TRAIN_TOKENIZER:
            tokenizer_file(tokenizer)
        return None
    if task == "causal_lm":
        info = inspect_corpus(data, dtype, field, tokenizer)
        check_vocab(info, int(model["arch"]["vocab_size"]))
        return info
    # the masked-LM preparation (data/mlm.py) trains its WordPiece, or takes a tokenizer file or folder (one with
    # vocab.txt only too: transformers converts it)
    info = inspect_corpus(data, dtype, field, None, text_tokenizer_default=TRAIN_TOKENIZER)
    if info.is_tokens:
        raise ValueError(f"train.data / --data {data}: token ids; {model.get('name')} (masked LM) prepares its "
                         "samples from text (txt, jsonl, parquet, a datasets folder)")  # fmt: skip
    if tokenizer and tokenizer != TRAIN_TOKENIZER:
        if not Path(tokenizer).exists():
            raise ValueError(f"train.tokenizer / --tokenizer {tokenizer}: no such file or folder")
        info.tokenizer = tokenizer
    return info

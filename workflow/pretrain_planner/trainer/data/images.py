"""Images for the image-classification task (ViT, ConvNeXt): a local image folder (one sub-folder per class: .npy
arrays HxWxC or CxHxW, or image files when Pillow is installed), resized to the recipe's image size; or, without
data, synthetic images (seeded noise with a class-dependent pattern, so a model can learn them), labelled as such.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

SYNTHETIC_IMAGES_LABEL = "synthetic images (seeded noise with a class pattern, not a real data set)"
IMAGE_SUFFIXES = (".npy", ".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")


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

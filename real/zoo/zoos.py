"""The zoo's model families: which data, which checkpoint folder, which token grid.

A ``Zoo`` names everything the zoo's shared code (``vq``, ``gpt``, ``classifier``, the ``train_*`` scripts)
needs to know about one family of shipped models; the scripts take it as ``--zoo NAME``:

* ``mnist`` (default): the 5,000 MNIST digits of ``real.zoo.data``, 28x28 grey, a 7x7 grid of 512 codes,
  10 classes; weights in ``real/zoo/checkpoints/``.
* ``natural256``: 64x64 RGB crops of the packaged photographs of ``real.zoo.natural``, a 16x16 grid of 1,024
  codes (256 tokens, LlamaGen's 256-pixel shape), 16 classes; weights in ``real/zoo/checkpoints_natural256/``.
"""
from __future__ import annotations

import importlib
import pathlib
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent


@dataclass(frozen=True)
class Zoo:
    """One family: ``name``, its data module (``fingerprint``, ``train_split``, ``heldout_split``,
    ``check_images``, ``N_CLASSES``, ``IMAGE_SIZE``), checkpoint folder, token grid ``side`` x ``side`` over
    ``vocab`` codes, image ``channels``."""
    name: str
    data_module: str
    folder: str
    side: int
    vocab: int
    channels: int

    @property
    def data(self):
        """The data module (imported on first use)."""
        return importlib.import_module(self.data_module)

    @property
    def directory(self) -> pathlib.Path:
        """The folder of the shipped checkpoints and their ``manifest.json``."""
        return ROOT / self.folder

    @property
    def tokens(self) -> int:
        """Image tokens per image (side * side)."""
        return self.side * self.side

    @property
    def num_classes(self) -> int:
        """Classes (the CFG null class is index ``num_classes``)."""
        return self.data.N_CLASSES

    @property
    def image_size(self) -> int:
        """Pixels per image side."""
        return self.data.IMAGE_SIZE


ZOOS = {
    "mnist": Zoo("mnist", "real.zoo.data", "checkpoints", side=7, vocab=512, channels=1),
    "natural256": Zoo("natural256", "real.zoo.natural", "checkpoints_natural256", side=16, vocab=1024, channels=3),
}


def get(zoo: "str | Zoo") -> Zoo:
    """The ``Zoo`` named ``zoo`` (a ``Zoo`` passes through); ValueError naming the known ones otherwise."""
    if isinstance(zoo, Zoo):
        return zoo
    if zoo not in ZOOS:
        raise ValueError(f"unknown zoo {zoo!r}; choose from {sorted(ZOOS)}")
    return ZOOS[zoo]

"""The options of ``real.registry.build`` (``BuildOptions``), type-checked when made."""
from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass

__all__ = ["BuildOptions"]


@dataclass(frozen=True)
class BuildOptions:
    """Options of the model builders; None everywhere means "the model's default" (stated per builder)."""
    device: str | None = None             # cpu, cuda, cuda:N, auto (default cpu)
    dtype: str | None = None              # float32 (default), bfloat16, float16
    seed: int | None = None               # weights of random models, caption draws, class ids (default 0)
    num_images: int | None = None         # one condition per image (default 1)
    class_id: int | None = None           # c2i: this class for every image (default: seeded random)
    num_tokens: int | None = None         # tokens per image (default: the whole image)
    draft: str | None = None              # draft kind: layerskip, small, eagle (model-dependent default); "none"
    draft_layers: int | None = None       # layerskip drafts: target layers kept (default 1)
    model_type: str | None = None         # llamagen: c2i (default) or t2i
    image_size: int | None = None
    target_ckpt: str | None = None
    target_pretrained: str | None = None
    target_size: str | None = None
    draft_ckpt: str | None = None
    draft_pretrained: str | None = None
    draft_size: str | None = None
    drafter_dir: str | None = None        # trained EAGLE drafter directory
    vq_ckpt: str | None = None
    vq_size: str | None = None
    neighbors_k: int | None = None        # width of the LANTERN neighbour table (default 1001)
    lantern_neighbors: str | None = None  # LANTERN table: raw codebook distances (default, as released) or l2
    captions: str | None = None           # t2i: .pt list of {embedding, mask}
    prompts: tuple | list | None = None   # t2i / multimodal prompts

    def __post_init__(self):
        """TypeError naming the first option whose value is not of its declared type (None always allowed)."""
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            want = (numbers.Integral,) if f.type.startswith("int") else (tuple, list) if f.type.startswith("tuple") \
                else (str,)
            if v is not None and (not isinstance(v, want) or (f.type.startswith("int") and isinstance(v, bool))):
                raise TypeError(f"build option {f.name} (--{f.name.replace('_', '-')}) must be {' or '.join(t.__name__ for t in want)} or None, "
                                f"got {type(v).__name__} {v!r}")

    @classmethod
    def from_namespace(cls, ns) -> "BuildOptions":
        """The build options present in an argparse Namespace, or in any object holding the options as attributes
        (a frozen run config); other attributes are the caller's."""
        return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if hasattr(ns, f.name)})

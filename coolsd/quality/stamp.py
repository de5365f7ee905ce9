"""The reproducibility stamp of a quality figure: which library computed it (and its version), which feature
extractor and weights (with their sha256), which reference statistics file (with its sha256), how many
images, and the image preprocessing. Every report carries one; figures with different stamps are never
merged or compared silently (``require_same`` raises).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

__all__ = ["Stamp", "StampMismatch", "require_same", "library_versions", "file_sha256", "files_sha256"]


class StampMismatch(ValueError):
    """Two quality stamps that had to agree do not (another extractor, weights file, reference, image
    count, preprocessing or library version)."""


@dataclass(frozen=True)
class Stamp:
    """One figure's provenance. ``preprocessing`` is the extractor's (``Preprocessing.as_dict``), plus the
    generated images' own resize when one was applied (``eval_size``/``eval_resize``). ``reference`` and
    ``reference_sha256`` name the reference statistics (file or folder, None for CLIP score, which has no
    reference); ``images`` is the count of generated images the figure is over."""
    library: str                       # e.g. "torchmetrics 1.9.0"
    extractor: str                     # extractor name and version, e.g. "inception-v3-compat 2015-12-05"
    weights: str                       # the weights file / directory as given
    weights_sha256: str
    preprocessing: dict = field(default_factory=dict)
    reference: str | None = None
    reference_sha256: str | None = None
    images: int | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Stamp":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown or not {"library", "extractor", "weights", "weights_sha256"} <= set(d):
            raise ValueError(f"not a quality stamp (fields {sorted(d)}; expected {sorted(names)})")
        return cls(**d)

    def key(self, *fields: str) -> str:
        """Canonical JSON of the named fields (all when none are named): what equality is checked on."""
        d = self.as_dict()
        return json.dumps({k: d[k] for k in (fields or d)}, sort_keys=True)

    def with_(self, **kw) -> "Stamp":
        return dataclasses.replace(self, **kw)


# what a reference computed with one extractor must share with the generated images' extractor: the rest
# (library version, reference file, image count) may differ between a stats file and its use
EXTRACTOR_FIELDS = ("extractor", "weights_sha256", "preprocessing")


def require_same(stamps, what: str, fields: tuple = ()) -> None:
    """Raise StampMismatch (one line naming the first differing field and both values) unless every stamp
    of ``stamps`` (Stamp or dict, at least one) agrees on ``fields`` (default: all of them). ``what`` says
    what was being combined, e.g. "the settings of this report"."""
    stamps = [s if isinstance(s, Stamp) else Stamp.from_dict(s) for s in stamps]
    if not stamps:
        raise ValueError("require_same needs at least one stamp")
    first = stamps[0].as_dict()
    for s in stamps[1:]:
        d = s.as_dict()
        for k in fields or first:
            if first[k] != d[k]:
                raise StampMismatch(f"{what}: quality stamps differ in {k!r} ({first[k]!r} vs {d[k]!r}); figures "
                                    "from another extractor, weights file, reference, image count or library are "
                                    "not comparable: recompute them with one setup")


def library_versions() -> str:
    """The metric library and its version, for ``Stamp.library`` (the Inception network's own package,
    torch-fidelity, is named in the extractor's version instead)."""
    from importlib import metadata

    return f"torchmetrics {metadata.version('torchmetrics')}"


def file_sha256(path) -> str:
    """Hex sha256 of one file (``real.nn.checkpoint.sha256_file``)."""
    from real.nn.checkpoint import sha256_file

    return sha256_file(path)


def files_sha256(files, root) -> str:
    """Our hash of a set of files (an image folder, a CLIP directory): sha256 over "relative name NUL sha256 of
    content" lines in name order, so a renamed, changed, added or removed file changes it."""
    import hashlib
    import pathlib

    root = pathlib.Path(root)
    h = hashlib.sha256()
    for f in sorted(pathlib.Path(f) for f in files):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + file_sha256(f).encode() + b"\n")
    return h.hexdigest()

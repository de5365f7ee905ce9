"""EAGLE-1 drafters for every registered model: made (``files.fresh_drafter``), trained on the target's features
(``features``: the data and its on-disk cache; ``train``: the one training loop), saved and loaded with their manifest
(``files``). The command line is ``coolsd train-drafter`` (``coolsd.commands.train_drafter``)."""
from .files import fresh_drafter, load_drafter, save_drafter, target_fingerprint

__all__ = ["fresh_drafter", "load_drafter", "save_drafter", "target_fingerprint"]

"""``python -m coolsd`` (and ``torchrun -m coolsd``): the same entry point as the ``coolsd`` script. The guard keeps a
spawned worker (``coolsd.workers``), which imports this module as ``__mp_main__``, from running the CLI."""
import sys

from coolsd.cli import main

if __name__ == "__main__":
    sys.exit(main())

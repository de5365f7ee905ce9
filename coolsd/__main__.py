"""``python -m coolsd`` (and ``torchrun -m coolsd``): the same entry point as the ``coolsd`` script."""
import sys

from coolsd.cli import main

sys.exit(main())

"""``python -m reservoir ...`` (what ``torchrun -m reservoir`` runs): the same as the ``reservoir`` console script."""

import sys

from reservoir.cli import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""``python -m jaxsem``: the same as the ``jaxsem`` console script."""

import sys

from .app.cli import main

if __name__ == "__main__":
    sys.exit(main())

"""``python -m services.kvmeta``."""

import sys

from services.kvmeta.main import main

if __name__ == "__main__":
    sys.exit(main())

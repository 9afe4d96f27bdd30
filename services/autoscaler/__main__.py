"""``python -m services.autoscaler``."""

import sys

from services.autoscaler.main import main

if __name__ == "__main__":
    sys.exit(main())

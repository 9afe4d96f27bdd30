"""``python -m services.scheduler``."""

import sys

from services.scheduler.main import main

if __name__ == "__main__":
    sys.exit(main())

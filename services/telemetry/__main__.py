"""``python -m services.telemetry``."""

import sys

from services.telemetry.main import main

if __name__ == "__main__":
    sys.exit(main())

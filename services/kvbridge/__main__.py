"""``python -m services.kvbridge`` = ``tideserve kv-bridge``."""

import sys

from services.kvbridge.cli import main

sys.exit(main())

"""``python -m services.kvmeta.bridge`` = ``tideserve kv-bridge``."""

import sys

from services.kvmeta.bridge.cli import main

sys.exit(main())

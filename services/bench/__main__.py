import sys

from services.bench.cli import main

sys.exit(main())

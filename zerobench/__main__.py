"""``python -m zerobench`` = the ``zerobench`` command."""

import sys

from zerobench.cli import main

sys.exit(main())

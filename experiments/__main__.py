"""``python -m experiments``: see :mod:`experiments.run_all`."""
import sys

from experiments.run_all import main

sys.exit(main())

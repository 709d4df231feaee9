"""`python -m engine ...` is `ninelives engine ...`."""
import sys

from .cli import main

sys.exit(main())

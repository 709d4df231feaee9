"""`python -m chaos.score`: the score's command line (`kill` is the test command cosmic-ray
runs in each mutated copy)."""
import sys

from chaos.score import main

sys.exit(main())

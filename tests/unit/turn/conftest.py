"""Makes the turn service's fakes importable as `turn_fakes` (pytest runs with --import-mode=importlib)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

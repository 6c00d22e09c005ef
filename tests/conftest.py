import sys
from pathlib import Path

# Let the tests run from a checkout (or a git worktree) without installing the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

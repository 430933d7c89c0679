"""Where the committed fixtures live (generated once by scripts/)."""

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"

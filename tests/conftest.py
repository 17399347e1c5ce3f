import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    return tmp_path

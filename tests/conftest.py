import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mpi_pool


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    order = {path: mpi_pool.test_file_order(path) for path in {item.path for item in items}}
    items.sort(key=lambda item: order[item.path])  # stable: each file's tests stay together and in order


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    return tmp_path


_file_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::")[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Wall time per test file (setup, call and teardown), slowest first: where CI's minutes go."""
    if not _file_seconds:
        return
    terminalreporter.section("wall time per test file")
    for path, seconds in sorted(_file_seconds.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
    terminalreporter.write_line(f"{sum(_file_seconds.values()):8.1f} s  in all")
    terminalreporter.write_line(f"MPI pools: {mpi_pool.stats['pools']} started, {mpi_pool.stats['jobs']} jobs run")

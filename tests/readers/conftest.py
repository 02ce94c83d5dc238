"""Property tests of every reader (issue 48): the hypothesis profile they run under, and the count of
examples each reader was tried with, printed at the end of the run.

`make test` runs the `readers` profile (a few hundred examples per reader, within the suite's budget);
`-m slow` selects these tests too and runs them under `readers-slow` (ten times as many).
"""
import pytest
from hypothesis import HealthCheck, settings

from tests.readers.fuzz import TRIED

_COMMON = dict(deadline=None, derandomize=True, print_blob=True,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                      HealthCheck.data_too_large, HealthCheck.filter_too_much])
settings.register_profile("readers", max_examples=200, **_COMMON)
settings.register_profile("readers-slow", max_examples=2000, **_COMMON)


def _slow(config) -> bool:
    expr = config.getoption("markexpr") or ""
    return "slow" in expr and "not slow" not in expr


def pytest_configure(config):
    settings.load_profile("readers-slow" if _slow(config) else "readers")


@pytest.hookimpl(tryfirst=True)  # before -m deselects: under -m slow these run too, with more examples
def pytest_collection_modifyitems(config, items):
    if _slow(config):
        for item in items:
            if "tests/readers/" in str(item.fspath).replace("\\", "/"):
                item.add_marker(pytest.mark.slow)


def pytest_terminal_summary(terminalreporter):
    if TRIED:
        profile = settings.get_profile("readers-slow" if _slow(terminalreporter.config) else "readers")
        terminalreporter.write_line(
            f"examples tried per reader (profile max_examples={profile.max_examples} per property): "
            + ", ".join(f"{reader} {n}" for reader, n in sorted(TRIED.items())))

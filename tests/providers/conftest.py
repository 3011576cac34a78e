import pytest

from tests.providers.contract import Sleeps


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()

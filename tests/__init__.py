"""The test suite. Test modules share code only through :mod:`tests.helpers` (and fixtures).

pytest rewrites the ``assert`` statements of test modules and conftests only; the helpers get
the same detailed failure messages by being registered here, before any of them is imported.
"""

import pytest

pytest.register_assert_rewrite("tests.helpers")

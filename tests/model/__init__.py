"""The stateful model test. Its other modules assert too: pytest rewrites their asserts
as it does a test module's, so a failure shows both sides."""

import pytest

pytest.register_assert_rewrite(
    "tests.model.machine", "tests.model.model", "tests.model.interventions"
)

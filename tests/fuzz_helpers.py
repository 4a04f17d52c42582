"""What the fuzz tests share: seeded hypothesis settings and strategies for JSON of any shape."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from devtools.cachedir import cache_dir

# Hypothesis keeps a cache of the constants it finds in the code; not in the work tree.
set_hypothesis_home_dir(cache_dir("hypothesis"))


def fuzz(default_examples: int) -> settings:
    """Seeded settings: the same ``default_examples`` cases every run (``TOPOLVM_FUZZ_EXAMPLES``
    sets another count for a longer campaign), no example database in the work tree, no
    deadline (a loaded CI machine must not turn slowness into failures)."""
    return settings(
        max_examples=int(os.environ.get("TOPOLVM_FUZZ_EXAMPLES", default_examples)),
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)

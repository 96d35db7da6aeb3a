"""The learning suite's ratios and their bootstrap intervals (benchmarks/learning_suite.py): what a row's
"× SB3" and its 90 % interval mean."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "learning_suite.py"
if str(_PATH.parent) not in sys.path:  # its sibling modules import as they do when it runs as a script
    sys.path.insert(0, str(_PATH.parent))
_spec = importlib.util.spec_from_file_location("learning_suite_for_tests", _PATH)
assert _spec is not None and _spec.loader is not None
suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suite)


def test_ratio_of_negative_returns_is_the_reference_over_ours():
    assert suite.return_ratio(200.0, 100.0) == 2.0
    assert suite.return_ratio(-50.0, -100.0) == 2.0  # closer to zero is better
    assert suite.return_ratio(10.0, -100.0) == float("inf")


def test_interval_needs_three_seeds_a_side_and_is_reproducible():
    assert suite.ratio_interval([1.0, 2.0], [1.0, 2.0, 3.0]) is None
    a, b = [240.0, 260.0, 170.0, 265.0], [270.0, 266.0, 274.0]
    assert suite.ratio_interval(a, b) == suite.ratio_interval(a, b)
    lo, hi = suite.ratio_interval(a, b)
    assert lo < suite.return_ratio(float(np.mean(a)), float(np.mean(b))) < hi


def test_identical_seeds_give_a_point():
    assert suite.ratio_interval([5.0] * 3, [4.0] * 4) == [1.25, 1.25]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(1.0, 500.0), min_size=3, max_size=8), st.lists(st.floats(1.0, 500.0), min_size=3,
                                                                            max_size=8))
def test_interval_lies_within_the_extreme_ratios(ours, ref):
    """Every resampled mean lies between a side's least and largest seed, so the interval does too."""
    lo, hi = suite.ratio_interval(ours, ref, draws=500)
    assert min(ours) / max(ref) - 1e-9 <= lo <= hi <= max(ours) / min(ref) + 1e-9

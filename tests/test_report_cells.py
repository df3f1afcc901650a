"""How a report writes a number and a ratio: never in scientific notation (money per task of a cheap
model, rates, counts from a trillionth to a trillion), float noise as 0, and ratios between folders
highlighted without a verdict."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from simulator.report import cells
from simulator.report.cells import number, ratio

MAGNITUDES = st.floats(min_value=1e-12, max_value=1e12, allow_nan=False, allow_infinity=False)


@given(st.one_of(MAGNITUDES, st.integers(min_value=1, max_value=10**12)), st.booleans())
def test_a_number_is_never_in_scientific_notation_and_reads_back(value, negative):
    value = -value if negative else value
    text = number(value)
    assert "e" not in text.lower() and "inf" not in text, text
    shown = float(text.replace(",", ""))
    if isinstance(value, int):
        assert "." not in text and int(text.replace(",", "")) == value  # a count: whole
    elif abs(value) >= 100:
        assert abs(shown - value) <= 0.5 + 1e-9 * abs(value), (value, text)  # whole, thousands separated
    else:  # three significant digits (or more) below 100
        assert math.isclose(shown, value, rel_tol=0.005), (value, text)


def test_small_values_are_fixed_point_and_noise_is_zero():
    assert number(8.68e-07) == "0.000000868"
    assert number(4.608e5) == "460,800"
    assert number(0.1 + 0.2 - 0.3) == "0"  # 5.55e-17: a difference of equal figures
    assert number(7.11e-15, "s") == "0 s"
    assert number(1e-12) == "0.000000000001"


def test_ratios_are_highlighted_in_neither_direction():
    assert ratio(1.2, 1.0).tone == ratio(0.8, 1.0).tone == "mark"
    assert ratio(1.0 + cells.DEVIATION / 2, 1.0).tone == ""
    assert ratio(3.0, 0.0).text == "-" and ratio(None, 1.0).text == "-"
    assert ratio(1e-7, 1.0).text == "0.0000001"
    assert {ratio(v, 1.0).tone for v in (0.01, 0.5, 0.9, 1.0, 1.1, 2.0, 100.0)} <= {"", "mark"}

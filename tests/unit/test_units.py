"""Strict unit parsers: what each grammar accepts, and hostile inputs float()/Decimal() would let through."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest

from app.core import units

# Inputs that Python's float() or Decimal() accept (or that look numeric) but no gpupack grammar may.
HOSTILE = [
    pytest.param("nan", id="nan"),
    pytest.param("NaN", id="NaN"),
    pytest.param("inf", id="inf"),
    pytest.param("-inf", id="minus-inf"),
    pytest.param("Infinity", id="Infinity"),
    pytest.param("1e-1", id="exponent"),
    pytest.param("1E2", id="exponent-upper"),
    pytest.param("0x1", id="hex"),
    pytest.param("0x1p-1", id="hex-float"),
    pytest.param("1_0", id="underscore"),
    pytest.param(" 0.5", id="leading-space"),
    pytest.param("0.5 ", id="trailing-space"),
    pytest.param("0.5\n", id="trailing-newline"),
    pytest.param("\t1", id="tab"),
    pytest.param("१.५", id="devanagari-digits"),
    pytest.param("٠.٥", id="arabic-indic-digits"),
    pytest.param("０.５", id="fullwidth-digits"),
    pytest.param("", id="empty"),
    pytest.param("-0.5", id="negative"),
    pytest.param("+0.5", id="plus-sign"),
    pytest.param("0,5", id="decimal-comma"),
    pytest.param(".", id="dot"),
    pytest.param("1.", id="trailing-dot"),
    pytest.param("1" * 40, id="overlong"),
]


@pytest.mark.parametrize(
    ("raw", "milli"),
    [
        pytest.param("0.25", 250, id="quarter"),
        pytest.param("0.5", 500, id="half"),
        pytest.param("0.01", 10, id="smallest"),
        pytest.param("0.1", 100, id="one-decimal"),
        pytest.param("1", 1000, id="one"),
        pytest.param("1.0", 1000, id="one-point-zero"),
        pytest.param("1.00", 1000, id="one-point-zero-zero"),
        pytest.param(".5", 500, id="no-leading-zero"),
        pytest.param("00.75", 750, id="leading-zeros"),
    ],
)
def test_fraction_accepts(raw: str, milli: int) -> None:
    assert units.fraction_milli(raw) == milli


@pytest.mark.parametrize(
    "raw",
    [
        *HOSTILE,
        pytest.param("0", id="zero"),
        pytest.param("0.0", id="zero-decimal"),
        pytest.param("0.00", id="zero-two-decimals"),
        pytest.param("1.5", id="above-one"),
        pytest.param("1.01", id="just-above-one"),
        pytest.param("2", id="two"),
        pytest.param("0.125", id="three-decimals"),
        pytest.param("0.001", id="below-resolution"),
        pytest.param("1/2", id="ratio"),
        pytest.param("50%", id="percent"),
        pytest.param("500m", id="quantity-milli"),
    ],
)
def test_fraction_refuses(raw: str) -> None:
    with pytest.raises(units.UnitError) as err:
        units.fraction_milli(raw)
    assert err.value.rule == "must be a decimal in (0, 1] with at most 2 decimals"


@pytest.mark.parametrize(
    ("raw", "mib", "rounded_from"),
    [
        pytest.param("4096", 4096, None, id="bare-mib"),
        pytest.param("1", 1, None, id="one-mib"),
        pytest.param("4Gi", 4096, None, id="gi"),
        pytest.param("4096Mi", 4096, None, id="mi"),
        pytest.param("1.5Gi", 1536, None, id="fractional-gi-whole-mib"),
        pytest.param(".5Gi", 512, None, id="no-leading-zero"),
        pytest.param("1Ti", 1 << 20, None, id="ti"),
        pytest.param("2048Ki", 2, None, id="ki-whole-mib"),
        pytest.param("8G", 7630, Decimal("7629.39453125"), id="decimal-g-rounded-up"),
        pytest.param("500M", 477, Decimal("476.837158203125"), id="decimal-m-rounded-up"),
        pytest.param("1Ki", 1, Decimal("0.0009765625"), id="tiny-rounded-up-to-one"),
        pytest.param("1.3Gi", 1332, Decimal("1331.2"), id="gi-not-whole-mib"),
    ],
)
def test_memory_accepts(raw: str, mib: int, rounded_from: Decimal | None) -> None:
    assert units.memory_mib(raw) == units.Memory(mib, rounded_from)


@pytest.mark.parametrize(
    ("raw", "rule"),
    [
        *[pytest.param(p.values[0], units.MEMORY_RULE, id=p.id) for p in HOSTILE],
        pytest.param("0", "must be more than 0", id="zero"),
        pytest.param("0Gi", "must be more than 0", id="zero-gi"),
        pytest.param("0.0Mi", "must be more than 0", id="zero-decimal-mi"),
        pytest.param("4096.5", units.MEMORY_RULE, id="fractional-bare-mib"),
        pytest.param("4gi", units.MEMORY_RULE, id="lowercase-suffix"),
        pytest.param("4K", units.MEMORY_RULE, id="uppercase-k"),
        pytest.param("4GB", units.MEMORY_RULE, id="gb"),
        pytest.param("4 Gi", units.MEMORY_RULE, id="inner-space"),
        pytest.param("4096000m", units.MEMORY_RULE, id="milli-suffix"),
        pytest.param("4e3", units.MEMORY_RULE, id="quantity-exponent"),
        pytest.param("-1Gi", units.MEMORY_RULE, id="negative-quantity"),
        pytest.param("Gi", units.MEMORY_RULE, id="suffix-only"),
    ],
)
def test_memory_refuses(raw: str, rule: str) -> None:
    with pytest.raises(units.UnitError) as err:
        units.memory_mib(raw)
    assert err.value.rule == rule


@pytest.mark.parametrize(("raw", "value"), [("1", 1), ("16", 16), ("007", 7)])
def test_positive_int_accepts(raw: str, value: int) -> None:
    assert units.positive_int(raw, 16) == value


@pytest.mark.parametrize("raw", [*HOSTILE, pytest.param("0", id="zero"), pytest.param("17", id="above-max")])
def test_positive_int_refuses(raw: str) -> None:
    with pytest.raises(units.UnitError) as err:
        units.positive_int(raw, 16)
    assert err.value.rule == "must be an integer from 1 to 16"


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("1000", Fraction(1000)),
        ("1k", Fraction(1000)),
        ("1e3", Fraction(1000)),
        ("1E3", Fraction(1000)),  # exponent, as the apiserver reads it, not exa
        ("4Gi", Fraction(4 << 30)),
        ("500m", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        ("-2", Fraction(-2)),
        ("x", None),
        ("", None),
        ("१", None),
    ],
)
def test_quantity_value(raw: str, value: Fraction | None) -> None:
    assert units.quantity_value(raw) == value

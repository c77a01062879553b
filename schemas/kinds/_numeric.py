"""Exact arithmetic shared by sum, mean and variance.

Three number modes, chosen per counter:

* ``integer``: Python ints, exact at any size.
* ``decimal``: :class:`decimal.Decimal` added in a context with the maximum precision and every
  inexact-result trap on, so a sum of money is never rounded (the router bounds each value's exponent, so
  the coefficient stays a few hundred digits at most).
* ``float``: binary fixed point. Every finite double is an integer multiple of 2**-1074, so a sum of
  doubles is held exactly as one Python int counting units of 2**-1074 (squares: units of 2**-2148).
  Integer addition is associative and commutative, so a merged state is bit-identical whatever the order
  or split of the stream; the float a reader sees is the exact sum rounded once (correctly rounded, which
  ``math.fsum`` also gives, but fsum's partials list is order-dependent and not a canonical stored form).
"""

import decimal
from decimal import Decimal

FLOAT_SHIFT = 1074
SQUARE_SHIFT = 2 * FLOAT_SHIFT

EXACT = decimal.Context(
    prec=decimal.MAX_PREC,
    Emax=decimal.MAX_EMAX,
    Emin=decimal.MIN_EMIN,
    traps=[
        decimal.InvalidOperation,
        decimal.Inexact,
        decimal.Rounded,
        decimal.Overflow,
        decimal.DivisionByZero,
    ],
)


def float_units(x: float | int) -> int:
    """Return ``x`` exactly, in units of 2**-1074."""
    if type(x) is int:
        return x << FLOAT_SHIFT
    p, q = x.as_integer_ratio()
    return p << (FLOAT_SHIFT + 1 - q.bit_length())


def float_square_units(x: float | int) -> int:
    """Return ``x * x`` exactly, in units of 2**-2148."""
    if type(x) is int:
        return (x * x) << SQUARE_SHIFT
    p, q = x.as_integer_ratio()
    return (p * p) << (SQUARE_SHIFT + 2 - 2 * q.bit_length())


def ratio_to_float(numerator: int, denominator: int) -> float:
    """Return numerator/denominator correctly rounded; ±inf when it exceeds the double range."""
    try:
        return numerator / denominator
    except OverflowError:
        return float("inf") if (numerator < 0) == (denominator < 0) else float("-inf")


def as_ratio(x: int | Decimal) -> tuple[int, int]:
    if type(x) is int:
        return x, 1
    assert isinstance(x, Decimal)
    return x.as_integer_ratio()

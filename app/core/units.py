"""Strict parsers for user-written quantities: GPU fraction → milli, GPU memory → MiB, counts (no floats)."""

from __future__ import annotations

import re
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Final, NamedTuple

MILLI_PER_GPU: Final = 1000
MIB: Final = 1 << 20

# Raw values longer than this are refused before any regex or Decimal work: no honest request needs
# it, and it bounds the cost of hostile input.
MAX_RAW_LEN: Final = 32

# Anchored ASCII grammars, matched with re.fullmatch. `[0-9]` (never `\d`) keeps non-ASCII digits
# out; Decimal()/float() would accept 'nan', 'inf', '1e-1', '1_0', ' 1 ' and '१.५', so the grammar
# decides what a number is and Decimal only ever sees strings the grammar let through.
_FRACTION: Final = re.compile(r"[0-9]+(?:\.[0-9]{1,2})?|\.[0-9]{1,2}")
_INTEGER: Final = re.compile(r"[0-9]+")
_QUANTITY: Final = re.compile(
    r"(?P<num>[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)"
)

# Bytes per suffix, as Kubernetes resource.Quantity defines them (binary SI and decimal SI).
_SUFFIX_BYTES: Final[dict[str, int]] = {
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "Pi": 1 << 50,
    "Ei": 1 << 60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}

FRACTION_RULE: Final = "must be a decimal in (0, 1] with at most 2 decimals"
MEMORY_RULE: Final = (
    "must be a whole number of MiB (e.g. 4096) or a Kubernetes quantity with a byte suffix "
    "Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P or E (e.g. 4Gi)"
)
MEMORY_POSITIVE_RULE: Final = "must be more than 0"


class UnitError(ValueError):
    """A raw value that does not fit the unit's grammar or range; `rule` is the user-facing sentence."""

    def __init__(self, rule: str) -> None:
        super().__init__(rule)
        self.rule = rule


class Memory(NamedTuple):
    """A parsed memory request. `rounded_from` holds the exact MiB when rounding up was needed."""

    mib: int
    rounded_from: Decimal | None = None


def fraction_milli(raw: str) -> int:
    """'0.25' → 250. Accepts a decimal in (0, 1] with at most 2 decimals; anything else is a UnitError."""
    if len(raw) > MAX_RAW_LEN or not _FRACTION.fullmatch(raw):
        raise UnitError(FRACTION_RULE)
    value = Decimal(raw)
    if not 0 < value <= 1:
        raise UnitError(FRACTION_RULE)
    return int(value * MILLI_PER_GPU)  # exact: at most 2 decimals, so a multiple of 10


def memory_mib(raw: str) -> Memory:
    """'4096' → 4096 MiB; '4Gi' → 4096 MiB; '500M' → 477 MiB (rounded up, see below).

    A bare integer is MiB (the KAI/Run:ai meaning of `gpu-memory`). A quantity with a byte suffix is
    converted to bytes and rounded *up* to a whole MiB, because memory is reserved in MiB and a user
    who asks for "500M" needs at least that much; `rounded_from` records the exact value so the
    caller can warn. Signs, exponents, the milli suffix 'm' and fractional bare numbers are refused.
    """
    if len(raw) > MAX_RAW_LEN:
        raise UnitError(MEMORY_RULE)
    if _INTEGER.fullmatch(raw):
        mib = int(raw)
        if mib <= 0:
            raise UnitError(MEMORY_POSITIVE_RULE)
        return Memory(mib)
    match = _QUANTITY.fullmatch(raw)
    if match is None:
        raise UnitError(MEMORY_RULE)
    # Integer arithmetic throughout: numerator/denominator of the written decimal, times the suffix.
    whole_part, _, decimals = match["num"].partition(".")
    numerator = int(whole_part + decimals or "0") * _SUFFIX_BYTES[match["suffix"]]
    denominator = 10 ** len(decimals) * MIB
    if numerator == 0:
        raise UnitError(MEMORY_POSITIVE_RULE)
    mib = -(-numerator // denominator)  # ceiling division
    if numerator % denominator == 0:
        return Memory(mib)
    with localcontext(prec=64):  # wide enough for any raw value MAX_RAW_LEN allows
        return Memory(mib, Decimal(numerator) / Decimal(denominator))


BYTES_RULE: Final = "must be a Kubernetes quantity of bytes (e.g. 4Gi or 7680Mi)"


def quantity_mib(raw: str) -> Memory:
    """'7680Mi' → 7680 MiB; a bare number is bytes, as in every Kubernetes quantity (KAI's NvFractions
    annotations take quantities). Rounded up to a whole MiB like `memory_mib`; a bare number under 1 MiB
    is refused rather than rounded, since it is almost surely MiB written without its suffix."""
    if len(raw) <= MAX_RAW_LEN and _INTEGER.fullmatch(raw):
        size = int(raw)
        if size == 0:
            raise UnitError(MEMORY_POSITIVE_RULE)
        if size < MIB:
            raise UnitError(f"is {size} bytes, less than 1 MiB (a bare number is bytes): write e.g. {size}Mi")
        mib = -(-size // MIB)
        return Memory(mib) if size % MIB == 0 else Memory(mib, Decimal(size) / Decimal(MIB))
    try:
        return memory_mib(raw)
    except UnitError as err:
        raise UnitError(BYTES_RULE if err.rule == MEMORY_RULE else err.rule) from None


SHARE_RULE: Final = "must be a decimal in (0, 1] with at most 5 decimals (a share of each GPU's memory)"
_SHARE: Final = re.compile(r"[0-9]*\.[0-9]{1,5}|[0-9]+")


def memory_share(raw: str) -> Fraction:
    """'0.75' → 3/4: a share of a GPU's memory (KAI's gpu-fraction.limit), exact, in (0, 1]."""
    if len(raw) > MAX_RAW_LEN or not _SHARE.fullmatch(raw):
        raise UnitError(SHARE_RULE)
    whole_part, _, decimals = raw.partition(".")
    value = Fraction(int(whole_part + decimals or "0"), 10 ** len(decimals))
    if not 0 < value <= 1:
        raise UnitError(SHARE_RULE)
    return value


UNIT_QUANTITY_RULE: Final = (
    "must be a Kubernetes quantity with a byte suffix (e.g. 8Gi or 8192Mi); KAI refuses a bare number here"
)


def unit_quantity_mib(raw: str) -> Memory:
    """'8Gi' → 8192 MiB: a quantity that must carry its byte suffix (KAI's gpu-memory.limit), rounded up to
    a whole MiB like `memory_mib`."""
    if len(raw) > MAX_RAW_LEN or _QUANTITY.fullmatch(raw) is None:
        raise UnitError(UNIT_QUANTITY_RULE)
    return memory_mib(raw)


def positive_int(raw: str, maximum: int) -> int:
    """'2' → 2. Accepts an ASCII integer in [1, maximum]; anything else is a UnitError."""
    rule = f"must be an integer from 1 to {maximum}"
    if len(raw) > MAX_RAW_LEN or not _INTEGER.fullmatch(raw):
        raise UnitError(rule)
    value = int(raw)
    if not 1 <= value <= maximum:
        raise UnitError(rule)
    return value


_ANY_QUANTITY: Final = re.compile(
    r"(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE](?P<exp>[+-]?[0-9]{1,3}))?"
)
_SMALL_SUFFIX: Final[dict[str, Fraction]] = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
}


def quantity_value(raw: str) -> Fraction | None:
    """The exact value of any Kubernetes quantity ('1k', '1000', '1e3', '500m'), or None if it is not one.

    Used to compare what we wrote with what the apiserver hands back: it re-serializes quantities in
    canonical form, so '1000' comes back as '1k'.
    """
    match = _ANY_QUANTITY.fullmatch(raw) if len(raw) <= MAX_RAW_LEN else None
    if match is None:
        return None
    whole_part, _, decimals = match["num"].partition(".")
    value = Fraction(int(whole_part + decimals or "0"), 10 ** len(decimals))
    if (suffix := match["suffix"]) is not None:
        value *= _SMALL_SUFFIX.get(suffix) or _SUFFIX_BYTES[suffix]
    elif (exp := match["exp"]) is not None:
        value *= Fraction(10) ** int(exp)
    return -value if match["sign"] == "-" else value

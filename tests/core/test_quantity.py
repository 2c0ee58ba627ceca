"""`hami.quantity` reads apimachinery's quantity syntax with the values the `kubernetes` client's parser gives:
the two are held together here, on quantities built from the syntax and on arbitrary text."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity as client_parse

from hami.quantity import _parse, cpu_millis, memory_mib, parse_quantity

digits = st.text("0123456789", min_size=1, max_size=12)
numbers = st.one_of(
    digits,
    st.builds(lambda a, b: f"{a}.{b}", digits, digits),
    st.builds(lambda a: f"{a}.", digits),
    st.builds(lambda b: f".{b}", digits),
)
signed = st.builds(lambda sign, n: sign + n, st.sampled_from(["", "+", "-"]), numbers)
suffixes = st.one_of(
    st.sampled_from(["Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "", "k", "M", "G", "T", "P", "E"]),
    st.builds(lambda e, sign, d: f"{e}{sign}{d}", st.sampled_from("eE"), st.sampled_from(["", "+", "-"]), digits),
)
quantities = st.builds(lambda n, s: n + s, signed, suffixes)


@given(quantities)
@example("16Gi")
@example("500m")
@example("1E")  # exa, not an exponent
@example("1E3")
@example(".5Ki")
@example("-0.000000001n")
def test_every_quantity_of_the_syntax_has_the_clients_value(text: str) -> None:
    assert _parse(text) == client_parse(text)


@given(st.text(max_size=20))
@example("1_000")  # Python's Decimal takes these; the API server does not
@example("Infinity")
@example("١٢")  # Arabic-Indic digits: Decimal takes them too
@example("1K")  # the client's, not apimachinery's
@example("1ki")
@example("1e3.5")
def test_what_is_read_is_read_as_the_client_reads_it(text: str) -> None:
    value = _parse(text)
    if value is not None:
        assert value == client_parse(text)


@pytest.mark.parametrize("text", ["1_000", "Infinity", "NaN", "1K", "١٢", " 1 2", "1e", "e3", "1.2.3", "0x10"])
def test_what_the_api_server_would_refuse_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a Kubernetes quantity"):
        parse_quantity(text)


def test_values_in_the_units_counted() -> None:
    assert parse_quantity("1.5e3") == Decimal(1500)
    assert (cpu_millis("100u"), cpu_millis("2"), cpu_millis(0.25)) == (1, 2000, 250)
    assert (memory_mib("1Gi"), memory_mib("1e6"), memory_mib(" 512Mi ")) == (1024, 1, 512)

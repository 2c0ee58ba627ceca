"""The `hami.io/numa-alignment` parser against HAMi's rule (Go: `strings.ToLower(strings.TrimSpace(v))` must be
`best-effort` or `strict`), written here independently from Unicode's tables, and fuzzed."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.numaalign import (
    NUMA_ALIGNMENT_ANNOTATION,
    NumaAlignment,
    NumaAlignmentError,
    numa_alignment,
    parse_numa_alignment,
)


def go_is_space(c: str) -> bool:
    """Go's unicode.IsSpace: the Latin-1 spaces, else Unicode's White_Space (the Z categories above Latin-1)."""
    if ord(c) < 0x100:
        return c in "\t\n\v\f\r \x85\xa0"
    return unicodedata.category(c) in ("Zs", "Zl", "Zp")


def go_rule(value: str) -> NumaAlignment | None:
    start, end = 0, len(value)
    while start < end and go_is_space(value[start]):
        start += 1
    while end > start and go_is_space(value[end - 1]):
        end -= 1
    # unicode.ToLower maps each rune to one rune; U+0130 is the one letter whose full lowercase (Python's) is longer
    lowered = "".join("i" if c == "\u0130" else c.lower() for c in value[start:end])
    return {"best-effort": NumaAlignment.BEST_EFFORT, "strict": NumaAlignment.STRICT}.get(lowered)


SPACES = st.text(alphabet=st.sampled_from(["\t", "\n", " ", "\x85", "\xa0", "\u2000", "\u2029", "\u3000"]), max_size=3)
NEAR = st.text(alphabet=st.sampled_from(list("strictbefoSTRICTBEFO-\u0130\u212a \t\x1c\x1f\u200b\ufeff")), max_size=14)


@given(value=st.text(max_size=40) | NEAR)
def test_fuzz_the_parser_follows_hamis_rule_and_raises_nothing_else(value: str) -> None:
    expected = go_rule(value)
    if expected is not None:
        assert parse_numa_alignment(value) is expected
        return
    with pytest.raises(NumaAlignmentError) as raised:
        parse_numa_alignment(value)
    assert repr(value) in str(raised.value)
    assert 'write "best-effort"' in str(raised.value)
    assert raised.value.value == value


@given(word=st.sampled_from(["strict", "best-effort"]), before=SPACES, after=SPACES, data=st.data())
def test_fuzz_either_value_in_any_case_within_any_go_space_is_read(
    word: str, before: str, after: str, data: st.DataObject
) -> None:
    upper = data.draw(st.lists(st.booleans(), min_size=len(word), max_size=len(word)))
    cased = "".join(c.upper() if u else c for c, u in zip(word, upper, strict=True))
    assert parse_numa_alignment(before + cased + after) is NumaAlignment(word)


@pytest.mark.parametrize("value", ["strict\x1c", "\u200bstrict", "strict\ufeff", "best effort", "best_effort", ""])
def test_what_go_does_not_trim_or_a_near_spelling_is_refused(value: str) -> None:
    with pytest.raises(NumaAlignmentError):
        parse_numa_alignment(value)


def test_the_dotted_capital_i_lowers_to_i_as_in_go() -> None:
    assert parse_numa_alignment("STR\u0130CT") is NumaAlignment.STRICT


def test_absent_means_no_alignment_and_present_is_read() -> None:
    assert numa_alignment({}) is None
    assert numa_alignment({"other": "strict"}) is None
    assert numa_alignment({NUMA_ALIGNMENT_ANNOTATION: "best-effort"}) is NumaAlignment.BEST_EFFORT


def test_the_error_names_the_nearest_value() -> None:
    with pytest.raises(NumaAlignmentError, match='did you mean "best-effort"'):
        parse_numa_alignment("best-efort")

"""Reading .properties files the way java.util.Properties does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from copier.core.properties import parse_properties


def values(text: str) -> dict[str, str]:
    return {k: v for k, (_, v) in parse_properties(text).items()}


def test_separators_comments_and_blank_lines() -> None:
    """=, : and white space all separate key from value; # and ! start comments."""
    text = "# comment\n! also\n\na = 1\nb:2\nc 3\n  d   =   four words  \n"
    assert values(text) == {"a": "1", "b": "2", "c": "3", "d": "four words  "}


def test_continuation_lines_are_joined_without_leading_space() -> None:
    """A trailing backslash continues the value on the next line."""
    assert values("key = one \\\n     two\n") == {"key": "one two"}


def test_escapes_and_last_key_wins() -> None:
    """Backslash escapes decode, and a repeated key keeps its last value."""
    assert values("k = a\\tb\\u0041\nk = second\nx\\:y = z\n") == {"k": "second", "x:y": "z"}


def test_line_numbers_point_at_the_key() -> None:
    """The line number of a key is where its logical line starts."""
    assert parse_properties("\n# c\nk = v \\\n  w\nz=1\n") == {"k": (3, "v w"), "z": (5, "1")}


@given(
    st.dictionaries(
        st.from_regex(r"[A-Za-z][A-Za-z0-9.]{0,20}", fullmatch=True),
        st.from_regex(r"[A-Za-z0-9 ,/:_-]{0,30}", fullmatch=True).map(str.strip),
    )
)
def test_written_then_read_gives_the_same_keys_and_values(entries: dict[str, str]) -> None:
    """Any simple key=value file reads back as written."""
    text = "".join(f"{k} = {v}\n" for k, v in entries.items())
    assert values(text) == entries

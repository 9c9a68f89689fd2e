"""The one CSV writer: byte for byte what pandas' to_csv writes, on whichever path it takes; parquet round-trips."""
from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnmem_sweep.tablefile import TableWriter, _arrow_table, csv_bytes, write_csv, write_table


def pandas_csv(frame: pd.DataFrame) -> bytes:
    """What every output file held before the fast writer: the reference."""
    return frame.to_csv(index=False, lineterminator="\n").encode("utf-8")


# words that need no quoting, and words that do (comma, quote, CR, LF, NUL), unicode and empty among them
PLAIN = st.text(st.characters(blacklist_characters=',"\r\n\x00', blacklist_categories=("Cs",)), max_size=8)
ANY_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)


@st.composite
def frames(draw, text=PLAIN):
    n = draw(st.integers(0, 12))
    columns: dict[str, object] = {}
    for i in range(draw(st.integers(2, 6))):
        kind = draw(st.sampled_from(["int64", "int8", "uint32", "bool", "category", "str", "object", "Int64"]))
        name = f"c{i}_{kind}"
        if kind in ("int64", "int8", "uint32"):
            info = np.iinfo(kind)
            values = draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=n, max_size=n))
            columns[name] = np.array(values, dtype=kind)
        elif kind == "bool":
            columns[name] = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
        elif kind == "Int64":
            values = draw(st.lists(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)), min_size=n, max_size=n))
            columns[name] = pd.array(values, dtype="Int64")
        else:
            words = draw(st.lists(text, min_size=1, max_size=4, unique=True))
            values = draw(st.lists(st.one_of(st.none(), st.sampled_from(words)), min_size=n, max_size=n))
            if kind == "category":
                columns[name] = pd.Categorical(values, categories=words)
            else:
                columns[name] = pd.Series(values, dtype="str" if kind == "str" else object)
    return pd.DataFrame(columns)


@settings(max_examples=300, deadline=None)
@given(frames())
def test_plain_frames_take_the_fast_path_and_match_pandas(frame):
    assert _arrow_table(frame) is not None
    assert csv_bytes(frame) == pandas_csv(frame)


@settings(max_examples=300, deadline=None)
@given(frames(text=ANY_TEXT))
def test_any_text_matches_pandas_whichever_path_it_takes(frame):
    assert csv_bytes(frame) == pandas_csv(frame)


# words that need quoting for a comma or a quote only: a categorical of them stays on the fast path (placeholders)
QUOTABLE = st.text(st.characters(blacklist_characters='\r\n\x00\x02', blacklist_categories=("Cs",)), max_size=8)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_categorical_with_commas_and_quotes_takes_the_fast_path_and_matches_pandas(data):
    n = data.draw(st.integers(0, 12))
    words = data.draw(st.lists(QUOTABLE, min_size=1, max_size=4, unique=True))
    values = data.draw(st.lists(st.one_of(st.none(), st.sampled_from(words)), min_size=n, max_size=n))
    frame = pd.DataFrame({"plan_stack": pd.Categorical(values, categories=words), "batch": np.arange(n),
                          "gpu": pd.Categorical(["h100-sxm"] * n)})
    assert _arrow_table(frame) is not None
    assert csv_bytes(frame) == pandas_csv(frame)


def test_the_results_plan_stack_is_quoted_as_pandas_quotes_it_over_many_chunks():
    """results.csv's plan_stack (a hand model's: commas) went to pandas for the whole file: 9 s for 1 M rows."""
    n = 300_000  # three of the writer's chunks
    stack = 'hand model, checked against torch 2.13-2.14, "truth"'
    frame = pd.DataFrame({"plan_stack": pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), [stack]),
                          "batch": np.arange(n, dtype=np.int64), "fits": np.arange(n) % 3 == 0})
    (table, subs) = _arrow_table(frame)
    assert subs == [(b"\x020\x03", b'"hand model, checked against torch 2.13-2.14, ""truth"""')]
    assert csv_bytes(frame) == pandas_csv(frame)


def test_a_value_holding_the_placeholders_mark_sends_the_table_to_pandas():
    frame = pd.DataFrame({"a": pd.Categorical(["x,y", "z"]), "b": ["\x020\x03", "w"]})
    assert _arrow_table(frame) is None
    assert csv_bytes(frame) == pandas_csv(frame)


@pytest.mark.parametrize("frame, why", [
    (pd.DataFrame({"a": [1.0, 2.5], "b": [1, 2]}), "floats: pandas writes 1.0 where pyarrow writes 1"),
    (pd.DataFrame({"a": ["x,y", "z"], "b": [1, 2]}), "a comma needs quotes"),
    (pd.DataFrame({"a,b": [1], "c": [2]}), "a column name with a comma"),
    (pd.DataFrame({"a": ["", None]}), "one column: Python's csv writes an empty value as \"\""),
    (pd.DataFrame({0: [1], 1: [2]}), "column names that are not strings"),
    (pd.DataFrame({"a": [1, "x"], "b": [1, 2]}), "an object column of mixed types"),
])
def test_what_pyarrow_would_write_differently_goes_to_pandas(frame, why):
    assert _arrow_table(frame) is None, why
    assert csv_bytes(frame) == pandas_csv(frame)


def test_chunked_writes_are_one_csv_with_one_header():
    frame = pd.DataFrame({"gpu": pd.Categorical(["a", "b", "a", "c"] * 50_000), "fits": [True, False] * 100_000,
                          "total_bytes": np.arange(200_000, dtype=np.int64) * 2**33})
    buf = io.BytesIO()
    w = TableWriter(buf, "csv")
    for lo in range(0, len(frame), 70_001):  # uneven chunks across the writer's own 131,072-row buffers
        w.write(frame.iloc[lo:lo + 70_001])
    w.close()
    assert buf.getvalue() == pandas_csv(frame)
    one = io.BytesIO()
    write_csv(frame, one)
    assert one.getvalue() == pandas_csv(frame)


def test_parquet_keeps_the_dtypes():
    frame = pd.DataFrame({"gpu": pd.Categorical(["h100-sxm", "a100-80gb"]), "batch": np.array([1, 2]),
                          "fits": [True, False], "total_bytes": np.array([2**40, 3], dtype=np.int64)})
    buf = io.BytesIO()
    write_table(frame, buf, "parquet")
    back = pd.read_parquet(io.BytesIO(buf.getvalue()))
    pd.testing.assert_frame_equal(back, frame)


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="unknown table format 'xlsx'"):
        TableWriter(io.BytesIO(), "xlsx")

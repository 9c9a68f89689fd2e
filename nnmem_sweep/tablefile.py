"""Tables to files: the one CSV writer every output file uses, and parquet.

CSV bytes are exactly what `DataFrame.to_csv(index=False, lineterminator="\\n")` writes (the format every output
has always had), produced by pyarrow's C++ CSV writer where that is provably the same text and by pandas otherwise:

- pyarrow writes a column of ints, of strings and of categoricals with string categories as pandas does once
  quoting is off, provided no value and no column name holds a character that makes Python's csv module quote
  (`,` `"` `\\r` `\\n`; NUL too, to be safe); both write a missing value as an empty field.
- booleans: pandas writes True/False, pyarrow true/false, so they go to pyarrow as a two-word dictionary.
- a categorical whose words hold `,` or `"` (results.csv's plan_stack: "hand model, checked against ..."): each
  such word goes to pyarrow as a placeholder (\x02 k \x03, where no value of the table holds \x02) that the
  written bytes then swap for the word as Python's csv quotes it (`"` around, `"` doubled); before, that one column
  sent a 1 M-row results.csv to pandas (9 s instead of 1.2).
- anything else (floats: pandas prints repr-style "1.0" where pyarrow prints "1"; objects of mixed types; a
  one-column table, where Python's csv writes an empty value as `""`) is written by pandas. Only small tables
  (the cluster options with their prices) take that path today.

tests/test_tablefile.py holds the two paths to the same bytes on random frames (hypothesis) and on every shipped
config's outputs. The fast path writes the 1 M-row results.csv (209 MB) in ~0.6 s where to_csv took ~6 s.

Parquet (`--format parquet`) keeps the dtypes (categoricals, bool, int64) and pandas' metadata:
`pd.read_parquet("results.parquet")` gives the frame back.
"""
from __future__ import annotations

import io
import re
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import IO

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv

FORMATS = ("csv", "parquet")
_NEEDS_QUOTES = re.compile(r'[,"\r\n\x00]')
_NEEDS_QUOTES_ARROW = _NEEDS_QUOTES.pattern
_BOOL_WORDS = pa.array(["False", "True"])
_BATCH_ROWS = 8192  # rows pyarrow formats at once; larger batches gain nothing measurable
_CHUNK_ROWS = 131_072  # rows formatted into one buffer before it is written: ~25 MB of CSV for results
_THREADS = 2  # formatting threads: the reference machine has 2 cores


def extension(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"unknown table format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return "." + fmt


def _plain_name(name: object) -> bool:
    return isinstance(name, str) and not _NEEDS_QUOTES.search(name)


def _strings_plain(values: pa.Array) -> bool:
    """No value of a string array needs quoting."""
    import pyarrow.compute as pc

    return not pc.any(pc.match_substring_regex(values, _NEEDS_QUOTES_ARROW)).as_py()


def _words(cats: pd.Index) -> bool:
    """Categories that are all strings (what either CSV path writes as a categorical's words)."""
    return pd.api.types.is_string_dtype(cats.dtype) and all(isinstance(c, str) for c in cats)


_QUOTABLE = re.compile(r'[,"]')  # what a categorical's word may hold on the fast path: quoted by placeholder
_UNQUOTABLE = re.compile(r'[\r\n\x00\x02]')  # what sends it to pandas (line ends, NUL, the placeholder's mark)


def _placeholders(col: pd.Series, subs: list[tuple[bytes, bytes]]) -> pd.Series | None:
    """A categorical with its words that need quoting replaced by placeholders (appended to `subs` with the quoted
    word each stands for); None where a word cannot be quoted so."""
    cats = col.dtype.categories
    if not _words(cats) or any(_UNQUOTABLE.search(c) for c in cats):
        return None
    new = []
    for c in cats:
        if _QUOTABLE.search(c):
            mark = f"\x02{len(subs)}\x03"
            subs.append((mark.encode(), ('"' + c.replace('"', '""') + '"').encode("utf-8")))
            c = mark
        new.append(c)
    return col.cat.rename_categories(new)


def _arrow_column(col: pd.Series) -> pa.Array | None:
    """The column as pyarrow writes it like pandas does, or None where only pandas writes it right."""
    dtype = col.dtype
    if dtype == np.bool_:
        return pa.DictionaryArray.from_arrays(pa.array(col.to_numpy().view(np.int8)), _BOOL_WORDS)
    if isinstance(dtype, np.dtype) and dtype.kind in "iu":
        return pa.array(col.to_numpy())
    if isinstance(dtype, pd.CategoricalDtype):
        cats = dtype.categories
        if not _words(cats):
            return None
        words = pa.array(list(cats), type=pa.large_string())
        if len(words) and not _strings_plain(words):
            return None
        codes = col.cat.codes.to_numpy()
        return pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), words)
    if isinstance(dtype, pd.StringDtype) or dtype == object:
        try:
            arr = pa.array(col, from_pandas=True)  # NaN and None become nulls, written empty as pandas does
        except (pa.ArrowException, TypeError, ValueError):
            return None
        if pa.types.is_null(arr.type):  # no value at all: empty fields, as pandas writes them
            return arr
        if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            return None
        return arr if not len(arr) or _strings_plain(arr) else None
    if isinstance(dtype, pd.Int64Dtype):
        return pa.array(col, type=pa.int64(), from_pandas=True)
    return None


def _arrow_table(frame: pd.DataFrame) -> tuple[pa.Table, list[tuple[bytes, bytes]]] | None:
    """(the frame for pyarrow's CSV writer, the placeholders its bytes swap back), or None where pandas must write
    it (see the module docstring)."""
    if frame.shape[1] < 2 or not all(_plain_name(n) for n in frame.columns) or not frame.columns.is_unique:
        return None
    arrays: list[pa.Array] = []
    subs: list[tuple[bytes, bytes]] = []
    for i in range(frame.shape[1]):
        col = frame.iloc[:, i]
        arr = _arrow_column(col)
        if arr is None and isinstance(col.dtype, pd.CategoricalDtype):
            marked = _placeholders(col, subs)
            arr = None if marked is None else _arrow_column(marked)
        if arr is None:
            return None
        arrays.append(arr)
    if subs and _holds_mark(frame):  # a value of the table holds the placeholders' mark: pandas writes it
        return None
    return pa.Table.from_arrays(arrays, names=list(frame.columns)), subs


def _holds_mark(frame: pd.DataFrame) -> bool:
    for i in range(frame.shape[1]):
        col = frame.iloc[:, i]
        if isinstance(col.dtype, pd.CategoricalDtype):
            if any(isinstance(c, str) and "\x02" in c for c in col.dtype.categories):
                return True
        elif (isinstance(col.dtype, pd.StringDtype) or col.dtype == object) and \
                col.astype(str).str.contains("\x02", regex=False).any():
            return True
    return False


def _pandas_csv(frame: pd.DataFrame, header: bool) -> bytes:
    return frame.to_csv(index=False, header=header, lineterminator="\n").encode("utf-8")


def write_csv(frame: pd.DataFrame, f: IO[bytes], header: bool = True) -> None:
    """Append `frame` as CSV to the binary file `f` (the header line first when `header`)."""
    arrow = _arrow_table(frame)
    if arrow is None:
        f.write(_pandas_csv(frame, header))
        return
    table, subs = arrow
    if header:
        f.write((",".join(table.column_names) + "\n").encode("utf-8"))
    starts = range(0, table.num_rows, _CHUNK_ROWS)
    if len(starts) <= 1:
        f.write(_csv_chunk(table, subs))
        return
    # pyarrow formats without the GIL: chunks are formatted on _THREADS threads while this one writes (and hashes)
    # the finished ones in order, at most _THREADS + 1 chunks held at once
    with ThreadPoolExecutor(_THREADS) as pool:
        pending: deque = deque()
        for lo in starts:
            pending.append(pool.submit(_csv_chunk, table.slice(lo, _CHUNK_ROWS), subs))
            if len(pending) > _THREADS:
                f.write(pending.popleft().result())
        while pending:
            f.write(pending.popleft().result())


def _csv_chunk(table: pa.Table, subs: list[tuple[bytes, bytes]]) -> memoryview | bytes:
    sink = pa.BufferOutputStream()
    pa_csv.write_csv(table, sink, pa_csv.WriteOptions(include_header=False, quoting_style="none",
                                                      batch_size=_BATCH_ROWS))
    if not subs:
        return memoryview(sink.getvalue())
    out = sink.getvalue().to_pybytes()
    for mark, quoted in subs:
        out = out.replace(mark, quoted)
    return out


def csv_bytes(frame: pd.DataFrame) -> bytes:
    """The frame as the CSV every output file uses: no index, '\\n' line ends, UTF-8."""
    buf = io.BytesIO()
    write_csv(frame, buf)
    return buf.getvalue()


class TableWriter:
    """Appends frames of one layout to one file, as CSV (header once) or as parquet (one row group each)."""

    def __init__(self, f: IO[bytes], fmt: str = "csv"):
        extension(fmt)
        self.f, self.fmt, self.rows = f, fmt, 0
        self._parquet = None

    def write(self, frame: pd.DataFrame) -> None:
        if self.fmt == "csv":
            write_csv(frame, self.f, header=self.rows == 0)
        else:
            import pyarrow.parquet as pq

            table = pa.Table.from_pandas(frame, preserve_index=False)
            if self._parquet is None:
                self._parquet = pq.ParquetWriter(self.f, table.schema)
            self._parquet.write_table(table)
        self.rows += len(frame)

    def close(self) -> None:
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None


def write_table(frame: pd.DataFrame, f: IO[bytes], fmt: str = "csv") -> None:
    """The whole frame to `f` as CSV or parquet."""
    w = TableWriter(f, fmt)
    w.write(frame)
    w.close()

"""The Python boundary converts from the C++ tables, not field by field: a record's status
has every field of RecordSummary's and RecordStatus's tables (read here from the header, not
from the extension), PoolSizing has the C++ PoolSizing's fields under the same names,
size_pool sends exactly SizingRequest's fields, and its settings are the C++ settings' table."""

import dataclasses
import inspect
import pathlib
import re

import pytest
import torch

import pagestash as ps

ROOT = pathlib.Path(__file__).resolve().parents[2]


def table_fields(header, macro):
    """The names of an X-macro table `#define macro(X) X(type, name, ...) ...` in `header`."""
    text = (ROOT / "include" / "pagestash" / header).read_text()
    body = re.search(r"#define " + macro + r"\(X\)((?:.*\\\n)*.*\n)", text).group(1)
    return re.findall(r"^\s*X\([^,]+,\s*(\w+),", body, flags=re.M)


def test_a_record_status_has_every_field_of_the_tables_in_order():
    expected = table_fields("stash/record.hpp", "PAGESTASH_RECORD_SUMMARY") + \
        table_fields("stash/record.hpp", "PAGESTASH_RECORD_STATUS")
    assert {"state", "error", "live_bytes", "refused_blocks", "launch_in_flight", "generation"} <= set(expected)
    pool = ps.PagePool(device_pages=8, page_bytes=4096)
    rec = pool.record("bf16/capacity", ps.Shape(4, 16, 64))
    status = rec.status()
    assert list(status) == expected
    assert status["state"] == "empty" and status["error"] == "none" and status["launch_in_flight"] is False


def sizing_table():
    """The names for_each_field(const PoolSizing&, fn) reports, read from the header."""
    text = (ROOT / "include" / "pagestash" / "sizing" / "pool_sizing.hpp").read_text()
    body = text[text.index("void for_each_field(const PoolSizing& p"):]
    return re.findall(r'fn\("(\w+)"', body[:body.index("\n}\n")])


def test_pool_sizing_has_the_cpp_fields_under_their_names():
    names = [f.name for f in dataclasses.fields(ps.PoolSizing)]
    assert ps._C.sizing_fields == sizing_table()
    assert names == sizing_table() + ["curve"]  # the curve: PeakDistribution::curve, at curve_points
    sizing = ps.size_pool([("bf16/capacity", ps.Shape(4, 256, 128))], tokens=64, top_k=1, samples=50, overflow=0.05)
    assert sizing.overflow == 0.05 and sizing.samples == 50 and sizing.seed == ps.sizing.DEFAULTS["seed"]
    assert sizing.device_bytes == sizing.device_pages * sizing.page_bytes
    assert sizing.saved_bytes == sizing.full_bytes - sizing.device_bytes


def test_size_pool_sends_exactly_the_request_table(monkeypatch):
    sent = {}

    def capture(**request):
        sent.update(request)
        raise RuntimeError("captured")

    monkeypatch.setattr(ps.sizing._C, "size_pool", capture)
    with pytest.raises(RuntimeError, match="captured"):
        ps.size_pool([("bf16/capacity", ps.Shape(4, 64, 128))], tokens=64)
    assert list(sent) == list(ps._C.sizing_request)


def test_an_unknown_request_field_is_refused():
    with pytest.raises(ValueError, match="size_pool has no argument 'overflow_target'"):
        ps._C.size_pool(recipes=["bf16/capacity"], shapes=[[4, 64, 128]], tokens=64, overflow_target=0.1)


def test_the_sizer_settings_are_the_cpp_table_with_its_defaults():
    names = table_fields("sizing/pool_sizing.hpp", "PAGESTASH_SIZING_SETTINGS")
    assert names == ["page_bytes", "host_pages", "samples", "seed", "overflow", "confidence", "bootstrap"]
    assert [name for name, _, _ in ps._C.sizing_settings] == names  # the binding's, in the table's order
    keywords = inspect.signature(ps.size_pool).parameters
    for name, default, what in ps._C.sizing_settings:
        assert what and keywords[name].default == default == ps.sizing.DEFAULTS[name], name
    request = list(ps._C.sizing_request)
    assert request[request.index("page_bytes"):request.index("page_bytes") + len(names)] == names

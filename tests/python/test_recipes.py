"""The recipes come from one list (include/pagestash/layouts/recipes.hpp): the names, the
families' dtypes and `recipe()` are built from what the extension reports per recipe, and
every recipe there is stashable from Python (test_ops.py's test_round_trip_every_recipe
runs a CPU round trip for each name of `recipes()`)."""

import pytest
import torch

import pagestash as ps
from pagestash import _C
from pagestash.recipes import family_of

TABLE = _C.recipe_table()


def test_the_table_is_the_list_of_names():
    assert [r["name"] for r in TABLE] == ps.recipes()
    assert len(set(ps.recipes())) == len(ps.recipes())


@pytest.mark.parametrize("row", TABLE, ids=[r["name"] for r in TABLE])
def test_each_name_is_its_parts(row):
    parts = [p for p in (row["family"], row["placement"], row["scales"]) if p]
    assert row["name"] == "/".join(parts)
    assert family_of(row["name"]) == row["family"]
    # recipe() composes it back from its parts (a part the recipe lacks is not asked).
    assert ps.recipe(row["family"], row["placement"] or "capacity", row["scales"] or "swizzled") == row["name"]
    family = ps.FAMILIES[row["family"]]
    assert family["data"] == (None if row["data_dtype"] is None else getattr(torch, row["data_dtype"]))
    assert family["scales"] == (None if row["scales_dtype"] is None else getattr(torch, row["scales_dtype"]))


def test_the_families_and_placements_it_reports():
    assert ps.FAMILIES["bf16"] == dict(data=torch.bfloat16, scales=None)
    assert ps.FAMILIES["nvfp4"] == dict(data=torch.float4_e2m1fn_x2, scales=torch.float8_e4m3fn)
    assert ps.FAMILIES["plain"] == dict(data=None, scales=None)
    assert {r["placement"] for r in TABLE} == {"", "packed", "packed_padded", "capacity"}
    assert {r["scales"] for r in TABLE} == {"", "compact", "swizzled"}
    assert ps.recipe("mxfp8", "packed_padded", "compact") == "mxfp8/packed_padded/compact"
    with pytest.raises(ValueError, match="no recipe of family 'bf16', placement 'packed_padded'"):
        ps.recipe("bf16", "packed_padded")

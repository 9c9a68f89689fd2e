"""units.py: sizes, sub-byte rounding and formatting."""
import pytest

from nnmem_sweep.units import GB, GiB, MiB, bits_to_bytes, format_bytes, parse_size


@pytest.mark.parametrize("text,expected", [
    ("80 GiB", 85_899_345_920), ("81559 MiB", 81_559 * MiB), ("80 GB", 80_000_000_000), ("8519680 B", 8_519_680),
    ("1.5 GiB", 1_610_612_736), (1024, 1024),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["80", "80 gigs", "0.5 B", -1, True, "GiB"])
def test_parse_size_refuses(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


def test_units_families_differ():
    assert GB == 10**9 and GiB == 2**30


def test_bits_to_bytes_rounds_up():
    assert bits_to_bytes(3, 4) == 2  # 12 bits -> 2 bytes, not 3 // 2 = 1 nor 4 // 8 = 0
    assert bits_to_bytes(1, 4) == 1
    assert bits_to_bytes(8, 1) == 1


def test_format_bytes_prints_the_unit():
    assert format_bytes(85_899_345_920) == "80.0 GiB"
    assert format_bytes(288_000_000, "MiB", 1) == "274.7 MiB"

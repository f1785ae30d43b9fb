"""ReservedArray: rows kept through growth, no move once reserved, honest resident bytes."""
import errno
import sys

import numpy as np
import pytest

from fleet.kernels import reserved_array as ra


@pytest.fixture
def reserve_early(monkeypatch):
    """Arrays move into a reservation past 1 KiB instead of 4 MiB."""
    monkeypatch.setattr(ra, "RESERVE_AFTER_BYTES", 1024)


def resident_bytes_of(array):
    """Rss of the mapping that holds ``array`` (from /proc/self/smaps)."""
    address = array.__array_interface__["data"][0]
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, stop = (int(x, 16) for x in head.split("-"))
                inside = start <= address < stop
            elif inside and head == "Rss:":
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping holds address {address:#x}")


def test_a_small_array_grows_on_the_heap_and_keeps_its_rows():
    arr = ra.ReservedArray((3,), np.float32, rows=4)
    arr.array[:4] = np.arange(12, dtype=np.float32).reshape(4, 3)
    grown = arr.ensure(5, keep=4)
    assert not arr.reserved and arr.capacity == 8 and grown is arr.array
    np.testing.assert_array_equal(grown[:4], np.arange(12, dtype=np.float32).reshape(4, 3))
    assert arr.memory_bytes(5) == 5 * 12


def test_a_large_array_moves_once_into_a_reservation_and_then_never_moves(reserve_early):
    arr = ra.ReservedArray((3,), np.float32, rows=10)
    arr.array[:10] = 7.0
    arr.ensure(1000, keep=10)
    assert arr.reserved
    assert arr.capacity >= ra.machine_bytes() // 12
    np.testing.assert_array_equal(arr.array[:10], np.full((10, 3), 7.0, np.float32))
    array, address = arr.array, arr.array.__array_interface__["data"][0]
    arr.array[999] = 1.0
    assert arr.ensure(arr.capacity // 2, keep=1000) is array
    assert arr.array.__array_interface__["data"][0] == address
    np.testing.assert_array_equal(arr.array[999], [1.0, 1.0, 1.0])


@pytest.mark.parametrize("rows", [10, 100_000], ids=["heap", "reserved"])
def test_a_zeroed_array_reads_zero_in_rows_it_grows_into(reserve_early, rows):
    arr = ra.ReservedArray((), np.uint8, rows=8, zeroed=True)
    arr.array[:8] = 255
    arr.ensure(rows, keep=8)
    assert arr.array[:8].tolist() == [255] * 8
    assert not arr.array[8:rows].any()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_memory_bytes_bounds_what_the_kernel_reports_resident(reserve_early):
    arr = ra.ReservedArray((10,), np.float32, rows=1000)
    assert arr.reserved and resident_bytes_of(arr.array) == 0  # reserved, nothing touched
    rows = 300_000  # 12 MB written
    arr.ensure(rows, keep=0)
    arr.array[:rows] = 1.0
    resident = resident_bytes_of(arr.array)
    estimate = arr.memory_bytes(rows)
    assert rows * 40 <= resident <= estimate + ra._THP_BYTES
    assert estimate - rows * 40 < ra._THP_BYTES


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_fresh_zeros_takes_no_memory_until_written():
    zeros = ra.fresh_zeros(1 << 21, np.uint64)  # 16 MiB
    assert resident_bytes_of(zeros) == 0
    zeros[: 1 << 18] = 0  # 2 MiB written
    assert 0 < resident_bytes_of(zeros) <= (2 << 20) + ra._THP_BYTES
    assert not zeros.any()


def test_a_reservation_shrinks_to_what_the_address_space_allows(reserve_early, monkeypatch):
    mapped = ra._mapped
    limit = {"rows": 50_000}
    attempts = []

    def limited(rows, row_shape, dtype):
        attempts.append(rows)
        if rows > limit["rows"]:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return mapped(rows, row_shape, dtype)

    monkeypatch.setattr(ra, "_mapped", limited)
    arr = ra.ReservedArray((), np.int64, rows=10_000)
    # halved from the machine-sized attempt until it fits
    assert attempts[0] >= ra.machine_bytes() // 8
    assert arr.reserved and 25_000 < arr.capacity <= 50_000 and attempts[-1] == arr.capacity
    arr.array[:10_000] = np.arange(10_000)
    # outgrowing a short reservation moves the rows into another one
    limit["rows"] = 200_000
    arr.ensure(arr.capacity + 1, keep=10_000)
    assert 100_000 < arr.capacity <= 200_000
    np.testing.assert_array_equal(arr.array[:10_000], np.arange(10_000))
    with pytest.raises(MemoryError, match=r"cannot reserve address space for 600000 rows of 8 bytes"):
        arr.ensure(300_000, keep=10_000)
    np.testing.assert_array_equal(arr.array[:10_000], np.arange(10_000))


def test_fresh_zeros_that_cannot_be_mapped_is_a_memory_error_naming_the_size(monkeypatch):
    def refuse(rows, row_shape, dtype):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(ra, "_mapped", refuse)
    with pytest.raises(MemoryError, match=r"cannot map 16777216 bytes for 2097152 zeros of uint64"):
        ra.fresh_zeros(1 << 21, np.uint64)

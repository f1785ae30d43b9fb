"""The shared-memory all_reduce's control block (fleet.transport.shared_control): a rank's
post wakes a rank waiting on that word in another mapping of the segment, a wait with
nothing posted returns after its timeout, descriptors and the published data segment
read back as stored."""
import threading
import time

import pytest

from fleet.transport import shared_control
from fleet.transport.shared_control import ARRIVED, REDUCED, ControlBlock

pytestmark = pytest.mark.skipif(not shared_control.supported(), reason="futexes on x86-64 Linux only")


@pytest.fixture
def blocks():
    """A control block of 3 ranks and a second mapping of it (as another rank has)."""
    made = ControlBlock.create(3)
    other = ControlBlock.attach(made.segment.key, made.segment.nbytes, 3)
    yield made, other
    other.close()
    made.close()


def test_a_post_wakes_a_rank_waiting_on_that_word_in_another_mapping(blocks):
    made, other = blocks
    woke = []

    def waiter():
        started = time.monotonic()
        while not other.wait(2, ARRIVED, 7, 5.0) and time.monotonic() - started < 5.0:
            pass
        woke.append(time.monotonic() - started)

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.2)  # the waiter sleeps in FUTEX_WAIT meanwhile
    assert not woke
    made.post(2, ARRIVED, 7)
    thread.join(5.0)
    assert len(woke) == 1 and 0.15 < woke[0] < 2.0, woke
    assert other.get(2, ARRIVED) == 7 and other.get(2, REDUCED) == 0


def test_a_wait_with_nothing_posted_returns_false_after_its_timeout(blocks):
    _, other = blocks
    started = time.monotonic()
    assert not other.wait(1, REDUCED, 3, 0.15)
    assert 0.1 < time.monotonic() - started < 2.0
    other.post(1, REDUCED, 3)
    assert other.wait(1, REDUCED, 3, 0.15)  # already there: no wait


def test_descriptors_and_the_data_segment_read_back_in_the_other_mapping(blocks):
    made, other = blocks
    desc = {"kind": "all_reduce", "op": "sum", "dtype": "float32", "shape": [2**40] * 64, "algo": "shm"}
    made.put_desc(1, shared_control.encode_desc(desc))
    assert other.desc(1) == desc and other.desc_bytes(1) == shared_control.encode_desc(desc)
    with pytest.raises(ValueError, match="does not fit"):
        made.put_desc(0, b"x" * shared_control.RECORD)
    assert other.data() == (0, [0, 0, 0], 0)
    made.publish_data([123, 45, 2**62], 1 << 30, 9)
    assert other.data() == (9, [123, 45, 2**62], 1 << 30)
    # operation numbers wrap in 32 bits, never to 0 (the initial value of every word)
    assert [shared_control.word(n) for n in (1, 2**32 - 2, 2**32 - 1, 2**32)] == [2, 2**32 - 1, 1, 2]

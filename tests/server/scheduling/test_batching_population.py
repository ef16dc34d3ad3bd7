"""PeakWindow on a fake clock: the most rows in the server within the last window."""

from __future__ import annotations

from server.scheduling.population import PeakWindow

MS = 1_000_000


def test_peak_is_the_largest_sample_within_the_window():
    w = PeakWindow(window_ns=100 * MS)
    assert w.peak(0) == 0
    for t, rows in [(0, 1), (10 * MS, 8), (20 * MS, 3), (30 * MS, 5)]:
        w.observe(t, rows)
    assert w.peak(30 * MS) == 8
    assert w.peak(109 * MS) == 8  # the 8 seen at 10 ms is still inside
    assert w.peak(111 * MS) == 5  # it left; 5 (at 30 ms) outlives the smaller 3 before it
    assert w.peak(131 * MS) == 0


def test_a_lone_client_reads_one_and_eight_clients_read_eight():
    lone, eight = PeakWindow(), PeakWindow()
    for k in range(50):  # one request in the server at a time, 20 ms each
        lone.observe(k * 20 * MS, 1)
    assert lone.peak(50 * 20 * MS) == 1
    for k in range(10):  # eight arrive, run together (sampled at the end with all 8 still in), come back
        for i in range(8):
            eight.observe(k * 100 * MS + i * MS, i + 1)
        eight.observe(k * 100 * MS + 90 * MS, 8)
    assert eight.peak(10 * 100 * MS) == 8


def test_samples_kept_are_only_those_that_can_still_be_the_peak():
    w = PeakWindow(window_ns=10**12)
    for rows in [5, 4, 3, 6]:
        w.observe(0, rows)
    assert list(w._samples) == [(0, 6)]


def test_expiry_is_when_the_peak_leaves_the_window():
    w = PeakWindow(window_ns=100 * MS)
    assert w.expires_at() is None
    w.observe(10 * MS, 8)
    w.observe(20 * MS, 2)
    assert w.expires_at() == 110 * MS
    assert w.peak(111 * MS) == 2 and w.expires_at() == 120 * MS

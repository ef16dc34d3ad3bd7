"""Issue 7's bar for the model readers, measured: a small file whose header claims gigabytes is refused with our
format error before anything that size is allocated (tracemalloc peak stays near the file's own size), quickly;
and random bytes in place of either format's files cost bounded time and memory."""

from __future__ import annotations

import struct
import time
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import EngineError, ModelFormatError
from engine.formats.pnnx.reader import load_graph
from engine.formats.pnnx.writer import write_pnnx
from engine.formats.tnn.constants import DT_FLOAT
from engine.formats.tnn.serializer import Serializer
from engine.formats.tnn.tnnmodel import read_model, read_model_bytes

KB = 1024
PEAK_LIMIT = 256 * KB  # a refused 1 KB file may cost parsing overhead, never its claimed size


def bounded(fn: Callable[[], object]) -> tuple[Exception | None, int, float]:
    """Run `fn`; (the EngineError it raised or None, peak traced bytes, seconds)."""
    tracemalloc.start()
    t0 = time.perf_counter()
    error = None
    try:
        fn()
    except EngineError as exc:
        error = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return error, peak, time.perf_counter() - t0


def rss_peak_added(fn: Callable[[], object]) -> int:
    """Run `fn`; how far the process's peak RSS rose above its RSS before (VmHWM reset through clear_refs)."""
    def status(key: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * KB for line in f if line.startswith(key))

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    before = status("VmRSS:")
    try:
        fn()
    except EngineError:
        pass
    return status("VmHWM:") - before


def tnn_claiming(length: int, dims: tuple[int, ...]) -> bytes:
    """A 1 KB .tnnmodel: one Convolution whose weight buffer claims `length` bytes of shape `dims`."""
    s = Serializer(2)
    s.u32(s.magic)
    s.i32(1)
    s.i32(1), s.string("Convolution"), s.string("c"), s.string("c"), s.i32(1)
    s.u32(s.magic), s.i32(DT_FLOAT), s.i32(length), s.i32(len(dims))
    for d in dims:
        s.i32(d)
    data = s.getvalue()
    return data + b"\0" * (KB - len(data))


@pytest.mark.parametrize(("length", "dims"), [
    (2**31 - 4, (2**29 - 1,)),  # the largest float32 byte length an i32 can claim, dims agreeing
    (2**31 - 4, (65536, 65536)),  # 16 GB of float32 by dims
    (16, (2**31 - 1, 2**31 - 1, 2**31 - 1)),  # a product that overflows 64 bits
])
def test_tnn_header_claiming_gigabytes_in_1kb(length: int, dims: tuple[int, ...]) -> None:
    data = tnn_claiming(length, dims)
    assert len(data) == KB
    error, peak, seconds = bounded(lambda: read_model_bytes(data, "claims.tnnmodel"))
    assert isinstance(error, ModelFormatError), error
    assert "claims.tnnmodel" in str(error) and error.offset is not None
    assert peak < PEAK_LIMIT and seconds < 1.0, (peak, seconds)


def test_huge_claims_in_tiny_files_do_not_raise_rss(tmp_path: Path) -> None:
    """The same claims as above, measured as the OS sees them: the peak RSS of the process does not move by more
    than noise while each tiny file is refused (tracemalloc above sees allocations never touched; this sees
    pages actually used)."""
    pnnx = write_pnnx(tmp_path / "m.pnnx.param", PARAM.format(shape="65536,65536"), {})
    with zipfile.ZipFile(pnnx.with_name("m.pnnx.bin"), "w", zipfile.ZIP_STORED) as z:
        z.writestr("big.data", np.zeros(4, np.float32).tobytes())
    tnn = tmp_path / "claims.tnnmodel"
    tnn.write_bytes(tnn_claiming(2**31 - 4, (2**29 - 1,)))
    for fn in (lambda: load_graph(pnnx), lambda: read_model(tnn),
               lambda: read_model_bytes(struct.pack("<Ii", Serializer(2).magic, 0x1FFFFFFF) + b"\0" * KB)):
        assert rss_peak_added(fn) < 16 * 1024 * KB


def test_tnn_resource_count_claiming_billions() -> None:
    data = struct.pack("<Ii", Serializer(2).magic, 0x1FFFFFFF) + b"\0" * (KB - 8)
    error, peak, _ = bounded(lambda: read_model_bytes(data, "count.tnnmodel"))
    assert isinstance(error, ModelFormatError) and peak < PEAK_LIMIT


PARAM = """7767517
3 3
pnnx.Input               in                       0 1 0 #0=(1,4)f32
pnnx.Attribute           big                      0 1 1 @data=({shape})f32 #1=({shape})f32
pnnx.Output              out                      2 0 0 1
"""


def test_pnnx_attribute_claiming_16gb_with_a_small_entry(tmp_path: Path) -> None:
    """The param text claims a 65536 x 65536 float32 weight; the archive holds 16 bytes for it."""
    path = write_pnnx(tmp_path / "m.pnnx.param", PARAM.format(shape="65536,65536"), {})
    with zipfile.ZipFile(path.with_name("m.pnnx.bin"), "w", zipfile.ZIP_STORED) as z:
        z.writestr("big.data", np.zeros(4, np.float32).tobytes())
    error, peak, seconds = bounded(lambda: load_graph(path))
    assert isinstance(error, ModelFormatError), error
    assert "m.pnnx.bin" in str(error) and "17179869184" in str(error)
    assert peak < PEAK_LIMIT and seconds < 1.0, (peak, seconds)


def test_pnnx_zip_entry_claiming_4gb_in_1kb(tmp_path: Path) -> None:
    """A stored entry whose zip64 size field says 4 GB, in a bin of about 1 KB."""
    path = write_pnnx(tmp_path / "m.pnnx.param", PARAM.format(shape="4"), {"big.data": np.zeros(4, np.float32)})
    bin_path = path.with_name("m.pnnx.bin")
    data = bytearray(bin_path.read_bytes())
    cd = data.index(b"PK\x01\x02")
    struct.pack_into("<II", data, cd + 20, 2**32 - 2, 2**32 - 2)  # compressed / uncompressed size: 4 GB
    data += b"\0" * max(0, KB - len(data))
    bin_path.write_bytes(bytes(data))
    error, peak, seconds = bounded(lambda: load_graph(path))
    assert isinstance(error, ModelFormatError), error
    assert peak < PEAK_LIMIT and seconds < 1.0, (peak, seconds)


def test_pnnx_header_counts_claiming_billions(tmp_path: Path) -> None:
    text = PARAM.format(shape="4").replace("\n3 3\n", "\n2147483647 2147483647\n")
    path = write_pnnx(tmp_path / "m.pnnx.param", text, {"big.data": np.zeros(4, np.float32)})
    error, peak, _ = bounded(lambda: load_graph(path))
    assert peak < PEAK_LIMIT, peak
    assert error is None or isinstance(error, ModelFormatError)


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.function_scoped_fixture])


@FUZZ
@given(st.binary(min_size=0, max_size=2 * KB))
def test_random_pnnx_bin_is_bounded(tmp_path_factory, data: bytes) -> None:
    path = write_pnnx(tmp_path_factory.mktemp("r") / "m.pnnx.param", PARAM.format(shape="4"),
                      {"big.data": np.zeros(4, np.float32)})
    path.with_name("m.pnnx.bin").write_bytes(data)
    error, peak, seconds = bounded(lambda: load_graph(path))
    assert error is None or isinstance(error, ModelFormatError)
    assert peak < PEAK_LIMIT and seconds < 1.0, (peak, seconds)


@FUZZ
@given(st.text(alphabet="0123456789(),=@#?.-_ \nfpnx.AIOutagbi", max_size=400))
def test_random_pnnx_param_is_bounded(tmp_path_factory, text: str) -> None:
    path = write_pnnx(tmp_path_factory.mktemp("t") / "m.pnnx.param", "7767517\n" + text,
                      {"big.data": np.zeros(4, np.float32)})
    error, peak, seconds = bounded(lambda: load_graph(path))
    assert error is None or isinstance(error, ModelFormatError), error
    assert peak < PEAK_LIMIT and seconds < 1.0, (peak, seconds)

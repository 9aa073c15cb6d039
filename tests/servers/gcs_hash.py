"""Checksums for the fake Cloud Storage server: CRC32C and MD5, streaming.

Cloud Storage reports CRC32C (Castagnoli) as the base64 of its 4 big-endian
bytes, and MD5 as the base64 of the 16-byte digest. The standard library has
MD5 (hashlib, C speed) but no CRC32C, so the server calls ISA-L's
crc32_iscsi through ctypes when libisal.so.2 is present (several GB/s), and
falls back to a table-driven pure-Python loop otherwise (a few MB/s: fine
for small tests, a warning is printed once). Composite objects get their
CRC32C by combining the components' values (crc32c_combine), so compose
never re-reads data.

    data chunk --> Hasher.update() --> md5 (hashlib) + crc (ISA-L or table)
"""

import base64
import ctypes
import ctypes.util
import hashlib
import queue
import struct
import sys
import threading

_POLY = 0x82F63B78  # reflected Castagnoli polynomial

_isal = None
for _name in ("libisal.so.2", ctypes.util.find_library("isal")):
    if not _name:
        continue
    try:
        _lib = ctypes.CDLL(_name)
        _isal = _lib.crc32_iscsi
        _isal.restype = ctypes.c_uint32
        _isal.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
        break
    except (OSError, AttributeError):
        _isal = None

_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ _POLY if _c & 1 else _c >> 1
    _TABLE.append(_c)

_warned = False

HANDOFF = 1 << 20  # bytes per buffer handed to a hasher's MD5 thread
HELD_MAX = 8  # buffers one hasher may hold at once
_POOL = queue.SimpleQueue()  # free HANDOFF buffers, reused by all hashers


def _raw_update(raw, buf):
    """Advance the un-inverted CRC state `raw` over the bytes-like `buf`."""
    global _warned
    n = len(buf)
    if n == 0:
        return raw
    if _isal is not None:
        mv = memoryview(buf).cast("B")
        pos = 0
        while pos < n:
            step = min(n - pos, 1 << 30)
            piece = mv[pos:pos + step]
            if piece.readonly:
                cbuf = ctypes.c_char_p(bytes(piece))
                raw = _isal(cbuf, step, raw)
            else:
                arr = (ctypes.c_char * step).from_buffer(piece)
                raw = _isal(ctypes.addressof(arr), step, raw)
                del arr
            pos += step
        return raw
    if not _warned:
        _warned = True
        print("fake_gcs: libisal.so.2 not found, CRC32C in pure Python "
              "(slow)", file=sys.stderr)
    t = _TABLE
    for b in bytes(buf):
        raw = t[(raw ^ b) & 0xFF] ^ (raw >> 8)
    return raw


def crc32c(data, value=0):
    """CRC32C of `data`, continuing from the finished CRC `value`."""
    return _raw_update(value ^ 0xFFFFFFFF, data) ^ 0xFFFFFFFF


def _gf2_times(mat, vec):
    s = 0
    i = 0
    while vec:
        if vec & 1:
            s ^= mat[i]
        vec >>= 1
        i += 1
    return s


def _gf2_square(mat):
    return [_gf2_times(mat, mat[n]) for n in range(32)]


def crc32c_combine(crc1, crc2, len2):
    """CRC32C of A+B from crc(A), crc(B) and len(B) (zlib's method)."""
    if len2 <= 0:
        return crc1
    # the operator appending one zero bit, squared twice: four zero bits;
    # each loop squares it again (1, 2, 4, ... zero bytes)
    op = _gf2_square(_gf2_square([_POLY] + [1 << n for n in range(31)]))
    while len2:
        op = _gf2_square(op)
        if len2 & 1:
            crc1 = _gf2_times(op, crc1)
        len2 >>= 1
    return crc1 ^ crc2


def b64_crc(value):
    return base64.b64encode(struct.pack(">I", value)).decode()


def b64_md5(digest):
    return base64.b64encode(digest).decode()


class Hasher:
    """Running CRC32C + MD5 over the bytes of one object, in order.

    MD5 (about 500 MB/s per core) is the slowest step of an upload, so
    pieces of 64 KiB and more are hashed by a helper thread while the
    handler goes on reading the socket (hashlib drops the GIL): the two
    overlap on two cores. sync() waits for it; every MD5 read syncs.
    The helper gets a copy of each piece in a 1 MiB buffer taken from a
    pool shared by all hashers (at most 8 held per hasher), not in a new
    bytes object: fresh allocations this size go back to the kernel when
    freed and come back as page faults (about 1 s of system time per GiB).

    with_md5 = False (the server's test-only --no-md5, for benchmarks)
    makes every Hasher compute CRC32C alone: md5_b64() is then None and
    the object carries no md5Hash, as a composite object on the service.
    """

    PIPELINE_MIN = 64 * 1024
    with_md5 = True

    def __init__(self):
        self.raw = 0xFFFFFFFF
        self._md5 = hashlib.md5() if self.with_md5 else None
        self.size = 0
        self.mark = None  # (size, raw, md5 copy) at the last quantum
        self._q = None
        self._thread = None
        self._pending_mark = None

    def _worker(self):
        while True:
            item = self._q.get()
            if item is None:
                return
            buf, n, mark = item
            self._md5.update(memoryview(buf)[:n])
            _POOL.put(buf)
            self._held.release()
            if mark is not None:
                self.mark = (mark[0], mark[1], self._md5.copy())

    def _send(self, data, mark):
        if self._q is None:
            self._q = queue.SimpleQueue()
            self._held = threading.Semaphore(HELD_MAX)
            self._thread = threading.Thread(target=self._worker,
                                            daemon=True)
            self._thread.start()
        mv = memoryview(data).cast("B")
        pos = 0
        while True:  # a mark goes with the last piece only
            n = min(len(mv) - pos, HANDOFF)
            self._held.acquire()
            try:
                buf = _POOL.get_nowait()
            except queue.Empty:
                buf = bytearray(HANDOFF)
            buf[:n] = mv[pos:pos + n]
            pos += n
            last = pos == len(mv)
            self._q.put((buf, n, mark if last else None))
            if last:
                return

    def sync(self):
        """Wait until the helper thread has hashed everything given."""
        if self._q is not None:
            self._q.put(None)
            self._thread.join()
            self._q = self._thread = None

    def update(self, buf, mark=False):
        self.raw = _raw_update(self.raw, buf)
        self.size += len(buf)
        m = (self.size, self.raw) if mark else None
        if self._md5 is None:
            if m is not None:
                self.mark = (m[0], m[1], None)
            return
        if self._q is not None or len(buf) >= self.PIPELINE_MIN:
            self._send(buf, m)
        else:
            self._md5.update(buf)
            if m is not None:
                self.mark = (m[0], m[1], self._md5.copy())

    def update_marked(self, buf, quantum):
        """update(), remembering the state at each multiple of quantum.

        A resumable session keeps only whole quanta when a piece is cut
        short; rewind() then goes back without re-reading the data.
        """
        mv = memoryview(buf)
        pos = 0
        while pos < len(mv):
            step = min(quantum - self.size % quantum, len(mv) - pos)
            end = self.size + step
            self.update(mv[pos:pos + step], mark=end % quantum == 0)
            pos += step

    def rewind(self, size):
        """Go back to `size` bytes; True if a mark allowed it."""
        self.sync()
        if size == self.size:
            return True
        if size == 0:
            self.__init__()
            return True
        mark = self.mark
        if mark is None or mark[0] != size:
            return False
        self.size, self.raw, md5 = mark
        self._md5 = md5.copy() if md5 is not None else None
        return True

    @property
    def md5(self):
        self.sync()
        return self._md5

    def crc(self):
        return self.raw ^ 0xFFFFFFFF

    def crc_b64(self):
        return b64_crc(self.crc())

    def md5_b64(self):
        """Base64 MD5, or None when MD5 is off (--no-md5)."""
        md5 = self.md5
        return None if md5 is None else b64_md5(md5.digest())


def parse_goog_hash(values):
    """{'crc32c': b64, 'md5': b64} from one or more x-goog-hash values."""
    out = {}
    for v in values:
        for part in v.split(","):
            k, sep, val = part.strip().partition("=")
            if sep:
                out[k.strip().lower()] = val.strip()
    return out

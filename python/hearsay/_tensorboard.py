"""A TensorBoard event file of scalars, written without TensorBoard or TensorFlow (neither
is a Debian package): the format TensorBoard reads, a TFRecord file of `Event` protocol
buffers. Each record is its length (u64, little-endian), the masked CRC32C of those 8
bytes, the bytes of one Event, and their masked CRC32C. The first Event names the file's
version; each later one holds a step, a wall time and a Summary of scalar values.
peer.log_metrics() writes here when the peer has a tensorboard_dir (docs/PYTORCH.md)."""
import os
import socket
import struct
import time

from . import _engine


def masked_crc32c(data):
    c = _engine.crc32c(bytes(data))
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# --- protocol buffer encoding: the few wire types an Event of scalars needs ---------------
def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field, wire):
    return _varint(field << 3 | wire)


def _bytes_field(field, data):
    return _key(field, 2) + _varint(len(data)) + data


def event(wall_time, step=None, file_version=None, scalars=None):
    """One Event's bytes: wall_time (1, double), step (2, int64), file_version (3, string),
    summary (5): Summary.value (1, repeated) of Value {tag (1, string), simple_value (2, float)}."""
    out = _key(1, 1) + struct.pack("<d", wall_time)
    if step is not None:
        out += _key(2, 0) + _varint(step & 0xFFFFFFFFFFFFFFFF)
    if file_version is not None:
        out += _bytes_field(3, file_version.encode())
    if scalars:
        summary = b"".join(_bytes_field(1, _bytes_field(1, tag.encode()) + _key(2, 5) + struct.pack("<f", value))
                           for tag, value in scalars.items())
        out += _bytes_field(5, summary)
    return out


def record(data):
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


class EventFileWriter:
    """Scalars to DIR/events.out.tfevents.TIME.HOST.PID, flushed at every write (a run that
    is killed keeps what it logged)."""

    def __init__(self, directory):
        os.makedirs(directory, exist_ok=True)
        now = time.time()
        self.path = os.path.join(directory, f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}")
        self._file = open(self.path, "ab")
        self._write(event(now, file_version="brain.Event:2"))

    def _write(self, data):
        self._file.write(record(data))
        self._file.flush()

    def scalars(self, step, values):
        self._write(event(time.time(), step=step, scalars=values))

    def close(self):
        if not self._file.closed:
            self._file.close()


def read_scalars(path):
    """The (step, {tag: value}) of every scalar Event in a file EventFileWriter wrote, each
    record's CRCs checked: what a test reads back. Raises ValueError on a damaged record."""
    out = []
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at < len(data):
        if len(data) - at < 12:
            raise ValueError(f"{path}: a record cut short at byte {at}")
        length_bytes = data[at:at + 8]
        (length,) = struct.unpack("<Q", length_bytes)
        (length_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        if masked_crc32c(length_bytes) != length_crc or len(data) - at - 12 < length + 4:
            raise ValueError(f"{path}: a damaged record length at byte {at}")
        body = data[at + 12:at + 12 + length]
        (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        if masked_crc32c(body) != body_crc:
            raise ValueError(f"{path}: a damaged record at byte {at}")
        step, values = _parse_event(body)
        if values:
            out.append((step, values))
        at += 16 + length
    return out


def _fields(data):
    at = 0
    while at < len(data):
        key, at = _read_varint(data, at)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _read_varint(data, at)
        elif wire == 1:
            value, at = data[at:at + 8], at + 8
        elif wire == 5:
            value, at = data[at:at + 4], at + 4
        elif wire == 2:
            n, at = _read_varint(data, at)
            value, at = data[at:at + n], at + n
        else:
            raise ValueError(f"wire type {wire}")
        yield field, wire, value


def _read_varint(data, at):
    n, shift = 0, 0
    while True:
        b = data[at]
        at += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, at


def _parse_event(body):
    step, values = None, {}
    for field, _, value in _fields(body):
        if field == 2:
            step = value
        elif field == 5:
            for f, _, v in _fields(value):
                if f != 1:
                    continue
                tag, number = None, None
                for vf, _, vv in _fields(v):
                    if vf == 1:
                        tag = vv.decode()
                    elif vf == 2:
                        (number,) = struct.unpack("<f", vv)
                values[tag] = number
    return step, values

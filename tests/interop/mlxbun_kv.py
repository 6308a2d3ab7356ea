"""An independent writer and reader of the seed's prompt-cache files (mlx-bun's `MLXBUNKV2`
layout, format versions 3 and 5, MLA kinds), in plain Python: the other side of
tests/persist/mlxbun.rs and mlxbun_blocks.rs.

  python3 mlxbun_kv.py write-example PATH   writes the seed's own test data (three layers: mla,
                                            mla-dsa, mtp-mla; createdAt 0) as mlx-bun writes it
  python3 mlxbun_kv.py write-example-blocks PATH BLOCK_BYTES
                                            the same in format version 5: a manifest at PATH,
                                            blocks of BLOCK_BYTES cut per batch row in
                                            blocks/<sha256> beside it (mlx-bun's writeBlocks)
  python3 mlxbun_kv.py read PATH            verifies a file (magic, header hash, fields, every
                                            tensor's hash, or every block's SHA-256 and its
                                            place inside one batch row) and prints its caches,
                                            one line per tensor:
                                            "layer kind offset family B T W v0 v1 ..."
"""
import hashlib
import json
import os
import struct
import sys

MAGIC = b"MLXBUNKV2\n"
ALIGN = 16384
MASK = (1 << 64) - 1
SECRET = (0xA0761D6478BD642F, 0xE7037ED1A0B428DB, 0x8EBC6AF09C88C6E3, 0x589965CC75374CC3)


def mum(a, b):
    x = a * b
    return x & MASK, x >> 64


def mix(a, b):
    lo, hi = mum(a, b)
    return lo ^ hi


def le(data, at, n):
    return int.from_bytes(data[at:at + n], "little")


def wyhash(data, seed=0):
    """Zig's std.hash.Wyhash.hash (what Bun.hash computes), written from the algorithm."""
    n = len(data)
    lanes = [seed ^ mix(seed ^ SECRET[0], SECRET[1])] * 3
    if n <= 16:
        if n >= 4:
            q = (n >> 3) << 2
            a = (le(data, 0, 4) << 32) | le(data, q, 4)
            b = (le(data, n - 4, 4) << 32) | le(data, n - 4 - q, 4)
        elif n > 0:
            a, b = (data[0] << 16) | (data[n >> 1] << 8) | data[n - 1], 0
        else:
            a = b = 0
    else:
        i = 0
        if n >= 48:
            while i + 48 < n:
                lanes = [mix(le(data, i + 16 * k, 8) ^ SECRET[k + 1], le(data, i + 16 * k + 8, 8) ^ lanes[k]) for k in range(3)]
                i += 48
            lanes[0] ^= lanes[1] ^ lanes[2]
        while i + 16 < n:
            lanes[0] = mix(le(data, i, 8) ^ SECRET[1], le(data, i + 8, 8) ^ lanes[0])
            i += 16
        a, b = le(data, n - 16, 8), le(data, n - 8, 8)
    a, b = mum(a ^ SECRET[1], b ^ lanes[0])
    return mix(a ^ SECRET[0] ^ n, b ^ SECRET[1])


def align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def atomically(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def write_blocks(folder, raw, row_bytes, block_bytes):
    """mlx-bun's segments(): each batch row apart, blocks of whole float32 values."""
    limit = max(1, block_bytes // 4) * 4
    listed = []
    for row in range(0, len(raw), row_bytes):
        data = raw[row:row + row_bytes]
        for at in range(0, len(data), limit):
            chunk = data[at:at + limit]
            name = hashlib.sha256(chunk).hexdigest()
            if not os.path.exists(os.path.join(folder, name)):
                atomically(os.path.join(folder, name), chunk)
            listed.append({"hash": name, "bytes": len(chunk)})
    return listed


def write(path, caches, tokens, meta, created_at, block_bytes=None):
    """caches: dicts with kind, offset, kvLoraRank, ropeHeadDim, [dsaHeadDim], maxTokens and
    tensors: (float list, [B, T, W]) in the order latent, rope, [index keys]. With block_bytes,
    format version 5: a manifest at path and the blocks in blocks/ beside it."""
    folder = os.path.join(os.path.dirname(path), "blocks")
    if block_bytes is not None:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    entries, blobs, cursor = [], [], 0
    for c in caches:
        slots = []
        for values, shape in c["tensors"]:
            raw = struct.pack("<%df" % len(values), *values)
            off = align(cursor)
            slot = {"off": off, "bytes": len(raw), "shape": shape, "dtype": 10, "hash": "%016x" % wyhash(raw)}
            if block_bytes is not None:
                slot["hash"] = ""
                slot["blocks"] = write_blocks(folder, raw, shape[1] * shape[2] * 4, block_bytes)
            slots.append(slot)
            blobs.append((off, raw))
            cursor = off + len(raw)
        entry = {k: c[k] for k in ("kind", "offset", "kvLoraRank", "ropeHeadDim", "dsaHeadDim", "maxTokens") if k in c}
        entry["tensors"] = slots
        entries.append(entry)
    version = 3 if block_bytes is None else 5
    header = {"formatVersion": version, "createdAt": created_at, **meta, "codecProvider": "mlx-cache-v3", "tokens": tokens, "caches": entries}
    text = json.dumps(header, separators=(",", ":")).encode()
    if block_bytes is not None:
        # mlx-bun's writeHeader: the data start is the header's end; nothing follows it.
        atomically(path, MAGIC + struct.pack("<IIQ", len(text), 26 + len(text), wyhash(text)) + text)
        return
    start = align(26 + len(text))
    out = bytearray(start + max(off + len(raw) for off, raw in blobs))
    out[0:10] = MAGIC
    struct.pack_into("<IIQ", out, 10, len(text), start, wyhash(text))
    out[26:26 + len(text)] = text
    for off, raw in blobs:
        out[start + off:start + off + len(raw)] = raw
    atomically(path, bytes(out))


def write_example(path, block_bytes=None):
    # The seed's test "MLA, MLA+DSA, and MTP rows clone and round-trip byte-identically".
    def t(values, width):
        return (values, [1, len(values) // width, width])
    caches = [
        {"kind": "mla", "offset": 2, "kvLoraRank": 2, "ropeHeadDim": 1, "maxTokens": 16,
         "tensors": [t([1, 2, 3, 4], 2), t([5, 6], 1)]},
        {"kind": "mla-dsa", "offset": 2, "kvLoraRank": 2, "ropeHeadDim": 1, "dsaHeadDim": 2, "maxTokens": 16,
         "tensors": [t([7, 8, 9, 10], 2), t([11, 12], 1), t([13, 14, 15, 16], 2)]},
        {"kind": "mtp-mla", "offset": 2, "kvLoraRank": 2, "ropeHeadDim": 1, "maxTokens": 16,
         "tensors": [t([17, 18, 19, 20], 2), t([21, 22], 1)]},
    ]
    write(path, caches, [101, 102], {"modelId": "glm-test", "configFingerprint": "glm-layout-v1"}, 0, block_bytes)


def read_blocks(folder, slot, row_bytes):
    """A version 5 tensor's bytes: its blocks in order, each checked against its SHA-256 name,
    none crossing a batch row."""
    raw, rows = b"", set()
    for block in slot["blocks"]:
        data = open(os.path.join(folder, block["hash"]), "rb").read()
        assert len(data) == block["bytes"] > 0 and hashlib.sha256(data).hexdigest() == block["hash"], "block hash"
        assert len(raw) // row_bytes == (len(raw) + len(data) - 1) // row_bytes, "a block crosses a batch row"
        raw += data
    return raw


def read(path):
    data = open(path, "rb").read()
    assert data[:10] == MAGIC, "magic"
    length, start, digest = struct.unpack_from("<IIQ", data, 10)
    text = data[26:26 + length]
    assert len(text) == length and wyhash(text) == digest, "header hash"
    header = json.loads(text)
    blocked = header["formatVersion"] == 5
    if blocked:
        assert start == 26 + length == len(data), "a manifest ends with its header"
    else:
        assert start % ALIGN == 0 and start >= 26 + length, "data start"
        assert all(b == 0 for b in data[26 + length:start]), "zero padding"
    assert header["formatVersion"] in (3, 5) and header["codecProvider"] == "mlx-cache-v3", header
    assert isinstance(header["createdAt"], int)
    print("tokens", " ".join(str(t) for t in header["tokens"]))
    for key in ("modelId", "configFingerprint", "tokenizerHash", "ns"):
        if key in header:
            print("meta", key, header[key])
    for layer, entry in enumerate(header["caches"]):
        kind = entry["kind"]
        widths = [entry["kvLoraRank"], entry["ropeHeadDim"]]
        if kind == "mla-dsa":
            widths.append(entry["dsaHeadDim"])
        else:
            assert "dsaHeadDim" not in entry and kind in ("mla", "mtp-mla"), entry
        assert len(entry["tensors"]) == len(widths)
        for family, (slot, width) in enumerate(zip(entry["tensors"], widths)):
            batch, tokens, w = slot["shape"]
            assert tokens == entry["offset"] and w == width and slot["dtype"] == 10, slot
            assert slot["off"] % ALIGN == 0 and slot["bytes"] == batch * tokens * w * 4, slot
            if blocked:
                assert slot["hash"] == "", slot
                raw = read_blocks(os.path.join(os.path.dirname(path), "blocks"), slot, tokens * w * 4)
                assert len(raw) == slot["bytes"], "tensor length"
            else:
                raw = data[start + slot["off"]:start + slot["off"] + slot["bytes"]]
                assert len(raw) == slot["bytes"] and "%016x" % wyhash(raw) == slot["hash"], "tensor hash"
            values = struct.unpack("<%df" % (len(raw) // 4), raw)
            print(layer, kind, entry["offset"], entry["maxTokens"], family, batch, tokens, w, " ".join(repr(v) for v in values))


if __name__ == "__main__":
    if sys.argv[1] == "write-example-blocks":
        write_example(sys.argv[2], int(sys.argv[3]))
    else:
        {"write-example": write_example, "read": read}[sys.argv[1]](sys.argv[2])

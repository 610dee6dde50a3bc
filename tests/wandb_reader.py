"""Reads a W&B offline run's `.wandb` file: the records `wandb sync` uploads, parsed with wandb's own protobuf
schema (`wandb.proto.wandb_internal_pb2.Record`). wandb no longer ships a Python reader of the file, so the
framing is read here: a 7-byte file header, then 32 KiB blocks of records, each with a 7-byte header (checksum,
little-endian length, type: full, first, middle or last piece), as in LevelDB's log format."""

import json
import struct

FILE_HEADER = 7
BLOCK = 32 * 1024
RECORD_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    position, pieces = FILE_HEADER, []
    while position + RECORD_HEADER <= len(data):
        left_in_block = BLOCK - (position % BLOCK)
        if left_in_block < RECORD_HEADER:  # the block's tail is padding
            position += left_in_block
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + RECORD_HEADER])
        if kind == 0 and length == 0:  # zero padding
            position += left_in_block
            continue
        payload = data[position + RECORD_HEADER:position + RECORD_HEADER + length]
        position += RECORD_HEADER + length
        if kind == FULL:
            yield payload
        elif kind == FIRST:
            pieces = [payload]
        elif kind == MIDDLE:
            pieces.append(payload)
        elif kind == LAST:
            yield b"".join(pieces + [payload])


def offline_history(run_dir):
    """(history rows, summary, config) of the run in `run_dir`."""
    from wandb.proto import wandb_internal_pb2
    [path] = run_dir.glob("*.wandb")
    history, summary, config = [], {}, {}
    for data in records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({_key(item): json.loads(item.value_json) for item in record.history.item})
        elif kind == "summary":
            summary.update({_key(item): json.loads(item.value_json) for item in record.summary.update})
        elif kind == "config":
            config.update({_key(item): json.loads(item.value_json) for item in record.config.update})
        elif kind == "run":
            config.update({_key(item): json.loads(item.value_json) for item in record.run.config.update})
    return history, summary, config


def _key(item):
    return item.key or "/".join(item.nested_key)

"""Reader for `.tnnproto`, the text half of a TNN model (both format versions).

Tokenized the way TNN does it: every `"` and newline is dropped and the text is split on commas, so a
record ends at a comma, not at a line end. Piece 0 is the header, 1 the inputs, 3 the outputs, 5.. the
layers (2, the blob list, and 4, the layer count, are informational). We additionally remember on which
line each piece starts so that errors and `Node.source` can point at it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import ModelFormatError, UnsupportedOpError
from engine.formats.model_files import read_file_bytes
from engine.formats.tnn.constants import DT_FLOAT, INPUT_DTYPES, MAGICS, is_known_type

_BLANKS = ' "\n\r\t'
MAX_RANK = 8


@dataclass
class TnnInput:
    name: str
    shape: tuple[int, ...]
    dtype_code: int = DT_FLOAT


@dataclass
class TnnLayer:
    type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    params: list[str]
    line: int


@dataclass
class TnnProto:
    path: str
    version: int
    magic: int
    inputs: list[TnnInput]
    outputs: list[str]
    layers: list[TnnLayer] = field(default_factory=list)
    blob_count: int = 0
    output_line: int = 0


def parse_proto(path: str | Path) -> TnnProto:
    raw = read_file_bytes(path, "cannot read")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ModelFormatError(str(path), "not a text file (invalid UTF-8)", offset=e.start) from None
    return parse_proto_text(text, str(path))


def parse_proto_text(text: str, path: str = "<tnnproto>") -> TnnProto:
    pieces = _split_pieces(text)
    if len(pieces) < 6:
        raise ModelFormatError(path, f"a .tnnproto needs at least 6 comma-separated records, found {len(pieces)}",
                               line=pieces[-1][1] if pieces else 1)
    (header, hline), (inputs, iline), _, (outputs, oline) = pieces[:4]
    magic, blob_count = _parse_header(header, path, hline)
    version = MAGICS[magic]
    proto = TnnProto(path, version, magic, _parse_inputs(inputs, version, path, iline), outputs.split(),
                     blob_count=blob_count, output_line=oline)
    if not proto.outputs:
        raise ModelFormatError(path, "the output record names no blob", line=oline)
    for body, line in pieces[5:]:
        if body.strip(" \t\r"):
            proto.layers.append(_parse_layer(body, path, line))
    return proto


def _split_pieces(text: str) -> list[tuple[str, int]]:
    """(cleaned piece, 1-based line of its first non-blank character) for every comma-separated record."""
    out: list[tuple[str, int]] = []
    line, start = 1, 0
    for chunk in text.split(","):
        first = start + (len(chunk) - len(chunk.lstrip(_BLANKS)))
        piece_line = line + text.count("\n", start, min(first, start + len(chunk)))
        out.append((chunk.replace('"', "").replace("\n", ""), piece_line))
        line += chunk.count("\n")
        start += len(chunk) + 1
    return out


def _int(token: str, what: str, path: str, line: int) -> int:
    try:
        return int(token)
    except ValueError:
        raise ModelFormatError(path, f"{what}: expected an integer, got {token!r}", line=line) from None


def _parse_header(header: str, path: str, line: int) -> tuple[int, int]:
    tokens = header.split()
    if len(tokens) < 4:
        raise ModelFormatError(path, f"header needs 4 numbers '1 <blobs> 1 <magic>', got {header.strip()!r}",
                               line=line)
    magic = _int(tokens[3], "header magic", path, line) & 0xFFFFFFFF
    if magic not in MAGICS:
        raise ModelFormatError(path, f"unknown TNN proto version magic {tokens[3]} "
                                     "(expected 4206624770 or 4206624772)", line=line)
    return magic, _int(tokens[1], "header blob count", path, line)


def _parse_inputs(record: str, version: int, path: str, line: int) -> list[TnnInput]:
    inputs = []
    for group in record.split(":"):
        tokens = group.split()
        if not tokens:
            continue
        inputs.append(_parse_input_v2(tokens, path, line) if version == 2 else _parse_input_v1(tokens, path, line))
    if not inputs:
        raise ModelFormatError(path, "the input record names no input", line=line)
    return inputs


def _parse_input_v1(tokens: list[str], path: str, line: int) -> TnnInput:
    if len(tokens) < 2 or len(tokens) - 1 > MAX_RANK:
        raise ModelFormatError(path, f"input {tokens[0]!r}: expected 'name d0 .. dn' (1..{MAX_RANK} dims)",
                               line=line)
    return TnnInput(tokens[0], tuple(_int(t, f"input {tokens[0]!r} dim", path, line) for t in tokens[1:]))


def _parse_input_v2(tokens: list[str], path: str, line: int) -> TnnInput:
    name = tokens[0]
    rank = _int(tokens[1], f"input {name!r} rank", path, line) if len(tokens) > 1 else -1
    if not 0 <= rank <= MAX_RANK or len(tokens) not in (rank + 2, rank + 3):
        raise ModelFormatError(path, f"input {name!r}: expected 'name rank d0 .. d(rank-1) [dtype]', "
                                     f"got {' '.join(tokens)!r}", line=line)
    dims = tuple(_int(t, f"input {name!r} dim", path, line) for t in tokens[2:2 + rank])
    # A real quantized model writes no dtype token; TNN itself would misread the last dim as the type.
    code = _int(tokens[-1], f"input {name!r} data type", path, line) if len(tokens) == rank + 3 else DT_FLOAT
    if code not in INPUT_DTYPES:
        raise ModelFormatError(path, f"input {name!r}: unknown data type code {code}", line=line)
    return TnnInput(name, dims, code)


def _parse_layer(body: str, path: str, line: int) -> TnnLayer:
    tokens = body.split()
    if len(tokens) < 4:
        raise ModelFormatError(path, f"layer record needs 'type name n_in n_out ...', got {body.strip()!r}",
                               line=line)
    ltype, name = tokens[0], tokens[1]
    n_in = _int(tokens[2], f"layer {name!r} input count", path, line)
    n_out = _int(tokens[3], f"layer {name!r} output count", path, line)
    if n_in < 0 or n_out < 1 or 4 + n_in + n_out > len(tokens):
        raise ModelFormatError(path, f"layer {name!r}: {n_in} inputs and {n_out} outputs do not fit its "
                                     f"{len(tokens) - 4} remaining tokens", line=line)
    if not is_known_type(ltype):
        raise UnsupportedOpError(f"tnn:{ltype}", name, f"{path}:{line}")
    ins = tokens[4:4 + n_in]
    outs = tokens[4 + n_in:4 + n_in + n_out]
    return TnnLayer(ltype, name, ins, outs, tokens[4 + n_in + n_out:], line)

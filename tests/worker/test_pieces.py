"""An export in host memory (worker/pieces.py): the collector's pieces hold exactly what was written, in
order, across pieces and the mappings they are cut from; its room is enforced before anything is copied; a
reader answers views of the pieces."""

from __future__ import annotations

import os

import pytest

from ardiff.worker.errors import TransferFailed
from ardiff.worker.pieces import PIECE_BYTES, REGION_BYTES, BodyReader, PieceCollector


def test_pieces_hold_what_was_written_across_pieces_and_regions() -> None:
    data = os.urandom(REGION_BYTES + 3 * PIECE_BYTES + 12345)
    collector = PieceCollector(len(data))
    for start, end in (
        (0, 7),
        (7, PIECE_BYTES + 3),
        (PIECE_BYTES + 3, REGION_BYTES + 5),
        (REGION_BYTES + 5, None),
    ):
        assert collector.write(memoryview(data)[start:end]) == len(data[start:end])
    pieces = collector.finish()
    assert [len(piece) for piece in pieces] == [PIECE_BYTES] * (len(pieces) - 1) + [12345]
    assert b"".join(pieces) == data
    assert all(not piece.readonly for piece in pieces)
    reader = BodyReader(iter(pieces))
    assert reader.view(10).obj is pieces[0].obj  # a view of the piece, not a copy
    assert reader.read(PIECE_BYTES) == data[10:PIECE_BYTES]  # at most what the piece has left


def test_a_write_past_the_room_is_refused_and_counts_nothing() -> None:
    class Full(Exception):
        pass

    collector = PieceCollector(100, Full)
    collector.write(bytes(60))
    with pytest.raises(Full, match="passed the 100 bytes"):
        collector.write(bytes(41))
    assert collector.size == 60
    assert b"".join(collector.finish()) == bytes(60)
    with pytest.raises(TransferFailed):  # the default refusal: a transfer's
        PieceCollector(1).write(b"ab")


def test_an_empty_export_has_no_pieces() -> None:
    assert PieceCollector(10).finish() == ()

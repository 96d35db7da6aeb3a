"""The wire layer: codecs, the message envelope, and the byte meter."""

from frugalrl.wire.codecs import CODECS, decode, encode, encoded_nbytes
from frugalrl.wire.message import (
    Message,
    WireError,
    decode_message,
    decode_state_dict,
    encode_message,
    encode_state_dict,
    message_sizes,
)
from frugalrl.wire.meter import DOWN, KINDS, UP, ByteMeter

__all__ = [
    "CODECS",
    "DOWN",
    "KINDS",
    "UP",
    "ByteMeter",
    "Message",
    "WireError",
    "decode",
    "decode_message",
    "decode_state_dict",
    "encode",
    "encode_message",
    "encode_state_dict",
    "encoded_nbytes",
    "message_sizes",
]

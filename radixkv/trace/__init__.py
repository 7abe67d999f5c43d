"""Traces: the columnar :class:`Trace` type and one reader module per format."""
from radixkv.trace.types import KVSeq, Trace

__all__ = ["KVSeq", "Trace"]

"""Errors radixkv raises for bad input.

Every input error names *where* it is: the file, the line or record (1-based line for
text formats, record index for binary ones) and the field. The CLI turns any
:class:`InputError` into exit status 2 with its message.
"""
from __future__ import annotations


class InputError(ValueError):
    """Bad input given to radixkv: a malformed trace, an impossible configuration.

    Attributes
    ----------
    path : str or None
        The file the error is in, when there is one.
    line : int or None
        1-based line number (text formats) or record number (other formats).
    field : str or None
        The field at fault.
    """

    def __init__(self, message: str, *, path=None, line=None, field=None):
        self.path = None if path is None else str(path)
        self.line = line
        self.field = field
        where = []
        if self.path is not None:
            where.append(self.path)
        if line is not None:
            where.append(f"line {line}")
        if field is not None:
            where.append(f"field '{field}'")
        prefix = ": ".join([", ".join(where)]) + ": " if where else ""
        super().__init__(prefix + message)
        self.reason = message


class TraceFormatError(InputError):
    """A trace file that cannot be read: invalid JSON, missing or malformed field."""


class ConfigError(InputError):
    """A configuration that cannot work: a pool too small, a block size that does not fit the trace."""

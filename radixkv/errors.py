"""Errors radixkv raises for bad input.

Every input error names *where* it is: the file, the line or record (1-based line for
text formats, record index for binary ones) and the field. The CLI turns any
:class:`InputError` into exit status 2 with its message, and prints an
:class:`InputWarning` (input read, but changed, e.g. sorted) as a warning.
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


class InputWarning(UserWarning):
    """Input radixkv read, but not as the file gave it (e.g. requests sorted into time order).

    Raised with :func:`warnings.warn`, never as an error: the result is well defined and
    deterministic. The message names the file, the line or record and the field as
    :class:`InputError` does; the CLI prints it as ``radixkv: warning: <where>: <what>``.

    Attributes
    ----------
    path, line, field, reason
        As :class:`InputError`'s.
    """

    def __init__(self, message: str, *, path=None, line=None, field=None):
        located = InputError(message, path=path, line=line, field=field)
        self.path, self.line, self.field, self.reason = located.path, line, field, message
        super().__init__(str(located))


class TraceFormatError(InputError):
    """A trace file that cannot be read: invalid JSON, missing or malformed field."""


class ConfigError(InputError):
    """A configuration that cannot work: a pool too small, a block size that does not fit the trace."""

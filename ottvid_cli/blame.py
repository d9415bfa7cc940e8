"""Whose mistake an exception is: the caller's, told in ottvid's own words, or a bug.

ottvid raises ValueError (and its subclasses) with one-line messages written for users about what
they gave. A ValueError raised inside a library (NumPy, transformers, a processor) while ottvid runs
is not about the user's input as they gave it: it is ottvid's bug (or a library's), and the CLI and
`ottvid serve` report it as an internal error rather than blaming the input.
"""

from __future__ import annotations

import os

PACKAGE = os.path.dirname(os.path.abspath(__file__))  # ottvid_cli/


def raised_by_ottvid(exc: BaseException) -> bool:
    """Whether ottvid's own code raised `exc`: the innermost frame of its traceback is in this package."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(PACKAGE + os.sep)

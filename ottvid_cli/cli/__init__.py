"""The `ottvid` command line: parse, call the library, render (docs/cli.md).

Exit codes: 0 done; 1 the model or the run failed (cannot load, not enough memory); 2 bad
arguments or input (including every usage error, as one line); 3 `ground` read no time span in the
reply; 4 the run finished (its answer printed) but the picture could not be written.

Arguments are checked, and missing files refused, before torch or transformers are imported. No
library module imports this package. A model command goes parse -> request -> engine -> render: its
options (each shared one declared once, options.py) become one `request.Request`, which the steps
(steps.py) check, run on the library's engine, and render (report.py). The layout: app.py (the Typer
app), errors.py (exit codes and one-line errors), options.py (shared options), request.py (the
request and its defaults), progress.py, steps.py (what every model command shares), report.py and
layout.py (the reports and their tables), and one module per command group (ask, profile, methods,
eval, serve, convert, cache).
"""

from . import clock  # noqa: F401  (first: the run's clock starts at this import)
from .app import app, main

__all__ = ["app", "main"]

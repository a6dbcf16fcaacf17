"""The files the `pcp-fn` commands write, checked before any work.

A figure, a table or a trace that cannot be written is found before the workload is
scheduled or costed (a long compare or record would otherwise fail at its end), and
named by its flag: `--plot out/x.png: No such file or directory (its folder out)`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence


def check_output_path(path: str, flag: str = "") -> None:
    """`OSError` naming `flag path` unless `path` can be written: no folder, its folder
    exists and is writable, an existing file writable (it is replaced)."""
    name = f"{flag} {path}" if flag else path
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), name)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(errno.ENOENT, f"{os.strerror(errno.ENOENT)} (its folder {folder})", name)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, f"{os.strerror(errno.EACCES)} (its folder {folder})", name)
    if os.path.lexists(path) and not os.access(path, os.W_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), name)


def check_plot_path(path: str, flag: str = "--plot") -> None:
    """[`check_output_path`][pcp_fn.sim.outputs.check_output_path], and: the extension names a
    format matplotlib writes, and matplotlib is importable; `ValueError` naming `flag` otherwise."""
    check_output_path(path, flag)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        raise ValueError(
            f"{flag} needs matplotlib, which is not installed: pip install 'pcp_fn[plot]'"
        ) from None
    formats = FigureCanvasAgg.get_supported_filetypes()
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if ext not in formats:
        given = f"extension .{ext}" if ext else "no extension"
        raise ValueError(
            f"{flag} {path}: {given}; name the figure's format by its extension: {', '.join(sorted(formats))}"
        )


def check_distinct(paths: Sequence[tuple[str, str | None]]) -> None:
    """`ValueError` when two of the `(flag, path)` outputs name the same file (one would
    overwrite the other)."""
    seen: dict[str, str] = {}
    for flag, path in paths:
        if path is None:
            continue
        real = os.path.realpath(path)
        if real in seen:
            raise ValueError(f"{seen[real]} and {flag} name the same file {path}")
        seen[real] = flag

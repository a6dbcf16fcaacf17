"""check_layout as a researcher meets it: a layout from a notebook cell or a file run by path, a
re-run cell, arguments out of range."""

from __future__ import annotations

import importlib.util
import runpy
import sys

import pytest
import torch

import pcp_fn
from pcp_fn.testing import LayoutCheckError, check_layout

# a layout file: its segments call a helper of the same file (Dynamo reads it through the module)
LAYOUT_FILE = """
import torch

import pcp_fn


def at_least_zero(length):
    return torch.clamp(length, min=0)


class ByPath(pcp_fn.MRV2Partition):
    name = {name!r}

    def segments(self, config, requests, rank):
        first, length = super().segments(config, requests, rank)
        return first, at_least_zero(length)
"""

QUICK = {"pcp_sizes": (2,), "max_examples": 1, "edges": False, "num_spec_tokens": 0}


def _write(tmp_path, stem, name):
    path = tmp_path / f"{stem}.py"
    path.write_text(LAYOUT_FILE.format(name=name))
    return path


def test_a_layout_from_a_file_run_by_path_passes_the_graph_checks(tmp_path):
    # runpy.run_path's module ("<run_path>") is gone from sys.modules once the file has run, and
    # importlib without sys.modules[name] = module never puts it there: Dynamo could not import
    # either, so check_layout puts the module in sys.modules for the graph checks
    names = ["test-user-run-path-1", "test-user-run-path-2", "test-user-importlib"]
    try:
        for name in names[:2]:  # two files under the one name "<run_path>"
            layout = runpy.run_path(str(_write(tmp_path, name.replace("-", "_"), name)))["ByPath"]()
            check_layout(layout, graph_pcp_sizes=(2,), **QUICK)
            assert "<run_path>" not in sys.modules
        spec = importlib.util.spec_from_file_location(
            "user_layouts", _write(tmp_path, "user_layouts", names[2])
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        check_layout(module.ByPath(), graph_pcp_sizes=(2,), **QUICK)
        assert "user_layouts" not in sys.modules
    finally:
        for name in names:
            if name in pcp_fn.available_layouts():
                pcp_fn.unregister_layout(name)


def test_code_in_a_module_no_import_finds_fails_the_graph_checks_saying_what_to_do(tmp_path):
    helper_path = tmp_path / "user_helpers.py"
    helper_path.write_text("import torch\n\n\ndef at_least_zero(x):\n    return torch.clamp(x, min=0)\n")
    spec = importlib.util.spec_from_file_location("user_helpers", helper_path)
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)  # not in sys.modules, not on sys.path

    class Helped(pcp_fn.MRV2Partition):
        name = "test-user-helped"

        def segments(self, config, requests, rank):
            first, length = super().segments(config, requests, rank)
            return first, helpers.at_least_zero(length)

    check_layout(Helped(), graph_pcp_sizes=(), **QUICK)  # exact
    fix = r"no module 'user_helpers' is importable.*sys\.modules\[spec\.name\] = module"
    # torch 2.13's Dynamo imports a traced function's module by its name
    if tuple(map(int, torch.__version__.split(".")[:2])) < (2, 14):
        with pytest.raises(LayoutCheckError, match=rf"fails the graph checks at P=2 .*{fix}"):
            check_layout(Helped(), graph_pcp_sizes=(2,), **QUICK)
    else:  # torch 2.14's does not: the graph checks pass, nothing to say
        check_layout(Helped(), graph_pcp_sizes=(2,), **QUICK)
    pcp_fn.unregister_layout("test-user-helped")


# a notebook cell: the class made anew on every run, in the notebook's __main__
CELL = """
import pcp_fn
from pcp_fn.testing import check_layout


class CellLayout(pcp_fn.MRV2Partition):
    name = "test-user-cell"


check_layout(CellLayout(), pcp_sizes=(2,), max_examples=1, graph_pcp_sizes=())
"""


def test_a_re_run_notebook_cell_checks_its_layout_again_and_another_class_is_told_how():
    first, again = {"__name__": "__main__"}, {"__name__": "__main__"}
    exec(CELL, first)
    exec(CELL, again)  # the same class re-made: it replaces the layout registered, no replace=True
    assert type(pcp_fn.get_layout("test-user-cell")) is again["CellLayout"] is not first["CellLayout"]

    class Renamed(pcp_fn.MRV2Partition):  # another class under the name: the user must say so
        name = "test-user-cell"

    with pytest.raises(ValueError, match=r"replace=True.*pcp_fn\.unregister_layout\('test-user-cell'\)"):
        check_layout(Renamed(), pcp_sizes=(2,), max_examples=1, graph_pcp_sizes=())
    assert type(pcp_fn.unregister_layout("test-user-cell")) is again["CellLayout"]
    check_layout(Renamed(), pcp_sizes=(2,), max_examples=1, graph_pcp_sizes=())
    assert type(pcp_fn.unregister_layout("test-user-cell")) is Renamed


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"pcp_sizes": 2}, TypeError, "pcp_sizes must be a sequence of ints"),
        ({"pcp_sizes": (0, 2)}, ValueError, r"pcp_sizes must hold ints >= 1"),
        ({"graph_pcp_sizes": (2.0,)}, ValueError, "graph_pcp_sizes must hold ints"),
        ({"max_examples": -1}, ValueError, "max_examples must be an int >= 0"),
        ({"num_spec_tokens": None}, ValueError, "num_spec_tokens must be an int >= 0"),
        ({"edges": "no"}, TypeError, "edges must be a bool"),
        ({"seed": "1"}, TypeError, r"seed= takes an int \(a random seed\) or None"),
        ({"max_num_tokens": 0}, ValueError, "max_num_tokens"),
    ],
)
def test_an_argument_out_of_range_is_named_before_anything_runs(options, error, match):
    with pytest.raises(error, match=match):
        check_layout("mrv2", **options)


def test_a_name_or_config_the_layout_does_not_serve_is_named():
    with pytest.raises(ValueError, match="unknown layout 'nope'"):
        check_layout("nope")
    # "mrv2-sharded" refuses spec tokens: check_layout says which argument to change
    with pytest.raises(ValueError, match=r"no config of layout 'mrv2-sharded' at P=1 .*num_spec_tokens=0"):
        check_layout("mrv2-sharded")
    check_layout("mrv2", pcp_sizes=(2, 3), max_examples=0, graph_pcp_sizes=())  # the edges alone
    check_layout("mrv2", pcp_sizes=(), graph_pcp_sizes=())  # nothing to run: no error


def test_a_layout_that_raises_is_named_with_its_traceback():
    class Raising(pcp_fn.MRV2Partition):
        name = "test-user-raising"

        def segments(self, config, requests, rank):
            if requests.num_scheduled.shape[0] > 2:
                raise RuntimeError("my bug")
            return super().segments(config, requests, rank)

    with pytest.raises(
        LayoutCheckError, match=r"breaks the ops .*the layout raised RuntimeError: my bug"
    ) as e:
        check_layout(Raising(), pcp_sizes=(2,), max_examples=3, graph_pcp_sizes=())
    assert isinstance(e.value.__cause__, RuntimeError)
    pcp_fn.unregister_layout("test-user-raising")

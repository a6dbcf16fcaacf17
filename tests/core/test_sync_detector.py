"""The package's sync detector catches what a graph cannot capture, and nothing else."""

import pytest
import torch

from pcp_fn import HostSyncError, assert_no_host_syncs, count_aten_ops, no_host_syncs

x = torch.arange(6)
mask = x > 2


@pytest.mark.parametrize(
    "bad",
    [
        lambda: x.sum().item(),
        lambda: int(x.max()),
        lambda: bool(x.any()),
        lambda: torch.nonzero(x),
        lambda: x[mask],
        lambda: torch.masked_select(x, mask),
        lambda: torch.unique(x),
        lambda: torch.repeat_interleave(x, x),
        lambda: torch.bincount(x),
        lambda: torch.equal(x, x),
        lambda: x.clone().index_put_((mask,), torch.tensor(0)),
    ],
)
def test_detector_raises(bad):
    with pytest.raises(HostSyncError):
        with no_host_syncs():
            bad()


def test_detector_allows_fixed_shape_work():
    def good():
        y = torch.repeat_interleave(x, x, output_size=15)
        z = torch.where(mask, x, 0)
        return torch.searchsorted(torch.cumsum(x, 0), z) + y[:6]

    assert assert_no_host_syncs(good).shape == (6,)
    assert count_aten_ops(good) >= 4


@pytest.mark.parametrize(
    "bad",
    [
        lambda: torch.tensor([1, 2], device=x.device),
        lambda: torch.as_tensor([1, 2], device=x.device),
        lambda: x.tolist(),
        lambda: x.numpy(),
        lambda: range(x[1]),
        lambda: [0, 1][x[0]],
    ],
)
def test_detector_raises_on_host_data(bad):
    with pytest.raises(HostSyncError):
        with no_host_syncs():
            bad()


def test_count_kernels_leaves_out_views():
    from pcp_fn.graph import OpCounter, count_kernels, is_view_op

    def fn():
        y = x.view(2, 3).unsqueeze(0).expand(2, 2, 3)  # views: no kernel
        a, b = y.unbind(0)
        return (a[0, 1:] + b.select(0, 1)[:2]).sum()  # add, sum: two kernels

    assert count_kernels(fn) == 2
    with OpCounter() as counter:
        fn()
    assert counter.kernels == 2 and counter.total == count_aten_ops(fn) > 2
    assert is_view_op(torch.ops.aten.slice.Tensor) and is_view_op(torch.ops.aten.unbind.int)
    assert not is_view_op(torch.ops.aten.add.Tensor) and not is_view_op(torch.ops.aten.add_.Tensor)
    assert not is_view_op(torch.ops.aten.index_select.default)

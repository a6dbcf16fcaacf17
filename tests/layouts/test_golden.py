"""Golden vectors from the vLLM / vllm-ascend docstrings, the runner's comments and vllm-ascend's tests."""

import torch

import pcp_fn
from pcp_fn import Bucket, PCPConfig, init_state, make_batch, update_tokens

REFERENCE_RESTORE = [0, 9, 1, 2, 10, 11, 12, 13, 3, 4, 5, 6, 14, 15, 16, 17, 7, 8]
REFERENCE_UNPAD = [True, False, True, True, True, True, True, False, False]
REFERENCE_UNPAD += [False, True, True, True, True, True, True, True, True]


def _docstring_step(rank, bucket=None):
    # tokens [1, 5, 8], P = 2; request 0 is a decode (context, one token, prompt done)
    cfg = PCPConfig(2, rank, 4, 64)
    batch = make_batch(cfg, [1, 5, 8], [7, 0, 0], [3, 5, 8], bucket=bucket)
    state, layout = update_tokens(init_state(cfg), batch)
    return cfg, batch, state, layout


def test_pcp_utils_docstring_both_ranks():
    expected_positions = {0: [0, 0, 1, 6, 7, 0, 1, 6, 7], 1: [0, 2, 3, 4, 5, 2, 3, 4, 5]}
    for rank in (0, 1):
        # with a bucket of exactly 9 local rows the restore index is vllm-ascend's, value for value
        _, _, _, lay = _docstring_step(rank, bucket=Bucket(3, 9))
        assert lay.pcp_tokens.tolist() == [1, 4, 4]
        assert lay.positions.tolist() == expected_positions[rank]
        assert lay.num_pads.tolist() == [1, 3, 0]
        assert lay.unpad_mask.tolist() == REFERENCE_UNPAD
        assert lay.restore_index.tolist() == REFERENCE_RESTORE
        assert int(lay.num_tokens) == 9
        assert int(lay.num_decode_reqs) == 1 and int(lay.num_decode_tokens) == 1


def test_pcp_utils_docstring_in_a_larger_bucket():
    _, batch, _, lay = _docstring_step(0)
    Lb = batch.bucket.num_tokens
    assert Lb == 16
    assert lay.pcp_tokens.tolist() == [1, 4, 4, 0]
    assert lay.positions.tolist() == [0, 0, 1, 6, 7, 0, 1, 6, 7] + [0] * 7
    assert lay.unpad_mask.tolist() == REFERENCE_UNPAD + [False] * 14
    # rank 1's rows start at Lb in the fixed-size gathered buffer instead of at 9
    expected = [i if i < 9 else i - 9 + Lb for i in REFERENCE_RESTORE]
    assert lay.restore_index.tolist() == expected + [0] * 14


def test_logits_slot_mapping_and_restore_of_the_docstring_batch():
    cfg, batch, state, lay = _docstring_step(0, bucket=Bucket(3, 9))
    # vllm-ascend: cumsum(pcp_tokens) * P - pads - 1 = [2, 10, 18] - [1, 3, 0] - 1
    assert pcp_fn.get_logits_indices(state)[1].tolist() == [0, 6, 17]
    # the slot mapping enters bucket-shaped: F_b = min(T, P * L_b) = 18 rows, padded on the host
    slots = torch.cat([torch.arange(100, 114, dtype=torch.int32), torch.full((4,), -1, dtype=torch.int32)])
    _, sm = pcp_fn.padded_slot_mapping(state, slots)
    assert sm.dtype == torch.int32
    assert sm.tolist() == [100, -1, 101, 102, 103, 104, 105, -1, -1, -1] + list(range(106, 114))
    # gathered rows carry their own index: restoring must reproduce vllm-ascend's order
    gathered = torch.arange(18, dtype=torch.float64).unsqueeze(1)
    _, restored = pcp_fn.restore_hidden_states(state, gathered)
    assert restored.squeeze(1).tolist() == [float(i) for i in REFERENCE_RESTORE]


def _pcp_tokens_p4(sched, comp=None, prompt=None):
    n = len(sched)
    cfg = PCPConfig(4, 0, 8, 128)
    batch = make_batch(cfg, sched, comp or [0] * n, prompt or sched)
    return update_tokens(init_state(cfg), batch)[1].pcp_tokens[:n].tolist()


def test_p4_rank0_pcp_tokens():
    assert _pcp_tokens_p4([8, 12, 16]) == [2, 4, 4]
    assert _pcp_tokens_p4([8, 4, 12], [8, 4, 0], [8, 0, 12]) == [2, 2, 4]
    assert _pcp_tokens_p4([3, 7, 9]) == [2, 2, 4]
    assert _pcp_tokens_p4([10]) == [4]


def test_cp_local_seq_lens_golden():
    seq = torch.tensor([1, 2, 128, 129])
    assert pcp_fn.cp_local_seq_lens(seq, 2, 2, 1).tolist() == [
        [[1, 0], [0, 0]],
        [[1, 1], [0, 0]],
        [[32, 32], [32, 32]],
        [[33, 32], [32, 32]],
    ]
    assert pcp_fn.cp_local_seq_lens(seq, 2, 1, 128).tolist() == [
        [[1], [0]],
        [[2], [0]],
        [[128], [0]],
        [[128], [1]],
    ]


def test_pcp_size_one_is_the_identity():
    cfg = PCPConfig(1, 0, 4, 64, num_spec_tokens=1)
    batch = make_batch(cfg, [2, 1, 7, 4], [9, 5, 0, 3], [9, 5, 7, 10], slot_mapping=range(500, 514))
    state, out = pcp_fn.step(init_state(cfg), batch)
    lay = out.layout
    assert lay.pcp_tokens.tolist() == [2, 1, 7, 4]
    assert lay.positions[:14].tolist() == [0, 1, 0, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3]
    assert lay.num_pads.tolist() == [0, 0, 0, 0]
    assert lay.restore_index[:14].tolist() == list(range(14))
    assert lay.unpad_mask[:14].all() and not lay.unpad_mask[14:].any()
    assert out.slot_mapping[:14].tolist() == list(range(500, 514))
    assert out.logits_indices.tolist() == [1, 2, 9, 13]  # query_start_loc[1:] - 1
    assert out.positions[:14].tolist() == [9, 10, 5, 0, 1, 2, 3, 4, 5, 6, 3, 4, 5, 6]

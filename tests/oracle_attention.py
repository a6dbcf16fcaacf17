"""Slow, obvious references for the attention index metadata and the multimodal helpers.

Plain Python, one request (and one token) at a time, sharing no code with
``pcp_fn``. The attention oracle lays out every prefill's gathered K/V rows and
the rank's query rows as explicit lists of ``(request, chunk, offset)`` entries
and reads every index off those lists by searching them; no offset formula.
"""

from __future__ import annotations

from dataclasses import dataclass

from oracle import is_decode, oracle_cp_local_seq_lens, oracle_step


@dataclass
class OracleAttention:
    num_computed_tokens_of_pcp_dcp: list  # [n][P][D]
    num_actual_tokens_pcp_padded: int
    num_decode_reqs: int
    unpad_mask: list[bool]
    restore_index_compact: list[int]  # vllm-ascend's (rank * num_tokens + local)
    index: dict[str, list[int]]  # P > 1 only
    per_request: dict[str, list[int]]  # P > 1 only


def oracle_attention(P, rank, D, interleave, sched, comp, prompt, spec=0, decode_seq_lens=None):
    step = oracle_step(P, sched, comp, prompt, spec)
    decode = [is_decode(n, c, p, 1 + spec) for n, c, p in zip(sched, comp, prompt)]
    context = []
    for i, (n, c) in enumerate(zip(sched, comp)):
        if decode[i]:
            context.append(decode_seq_lens[i] if decode_seq_lens is not None else c + n)
        else:
            context.append(c)
    out = OracleAttention(
        num_computed_tokens_of_pcp_dcp=oracle_cp_local_seq_lens(context, P, D, interleave),
        num_actual_tokens_pcp_padded=P * step.num_tokens,
        num_decode_reqs=sum(decode),
        unpad_mask=step.unpad_mask,
        restore_index_compact=step.restore_index(step.num_tokens),
        index={},
        per_request={},
    )
    if P == 1:
        return out

    h, t = rank, 2 * P - 1 - rank
    kv = []  # gathered K/V rows of the prefill part: (request, chunk, offset)
    query = []  # this rank's local query rows of the prefill part
    chunk_of = {}
    for i, dec in enumerate(decode):
        if dec:
            continue
        c = step.pcp_tokens[i] // 2
        chunk_of[i] = c
        for k in range(2 * P):
            kv += [(i, k, j) for j in range(c)]
        query += [(i, h, j) for j in range(c)] + [(i, t, j) for j in range(c)]

    names = [
        "q_head_idx",
        "q_tail_idx",
        "kv_with_q_head_nomask_idx",
        "kv_with_q_head_mask_idx",
        "kv_with_q_tail_nomask_idx",
        "kv_with_q_tail_mask_idx",
        "kv_tail_proj_idx",
        "kv_with_q_head_attn_idx_in_tail",
        "kv_with_q_tail_attn_idx_in_tail",
    ]
    idx = {name: [] for name in names}
    lens = {name: [] for name in names}
    for i in chunk_of:
        mine = lambda rows, keep, i=i: [r for r, e in enumerate(rows) if e[0] == i and keep(e[1])]  # noqa: E731
        per = {
            "q_head_idx": mine(query, lambda k: k == h),
            "q_tail_idx": mine(query, lambda k: k == t),
            "kv_with_q_head_nomask_idx": mine(kv, lambda k: k < h),
            "kv_with_q_head_mask_idx": mine(kv, lambda k: k == h),
            "kv_with_q_tail_nomask_idx": mine(kv, lambda k: k < t),
            "kv_with_q_tail_mask_idx": mine(kv, lambda k: k == t),
            "kv_tail_proj_idx": mine(kv, lambda k: k <= t),
        }
        # the tail projection is a list of K/V rows; "in tail" indices point into that list
        proj_before = len(idx["kv_tail_proj_idx"])
        proj = [kv[r] for r in per["kv_tail_proj_idx"]]
        per["kv_with_q_head_attn_idx_in_tail"] = [proj_before + p for p, e in enumerate(proj) if e[1] <= h]
        per["kv_with_q_tail_attn_idx_in_tail"] = [proj_before + p for p, e in enumerate(proj) if e[1] <= t]
        for name in names:
            idx[name] += per[name]
            lens[name].append(len(per[name]))
    concat = idx["q_head_idx"] + idx["q_tail_idx"]
    idx["q_full_idx"] = [concat.index(p) for p in range(len(query))]

    def running(values):
        total, out_ = 0, []
        for v in values:
            total += v
            out_.append(total)
        return out_

    out.index = idx
    out.per_request = {
        "attn_chunk_seqlens": list(chunk_of.values()),
        "attn_mask_seqlens": running(lens["q_head_idx"]),
        "head_attn_nomask_seqlens": running(lens["kv_with_q_head_nomask_idx"]),
        "tail_attn_nomask_seqlens": running(lens["kv_with_q_tail_nomask_idx"]),
        "head_actual_seq_lengths_kv": running(lens["kv_with_q_head_attn_idx_in_tail"]),
        "tail_actual_seq_lengths_kv": running(lens["kv_with_q_tail_attn_idx_in_tail"]),
    }
    return out


# ---- multimodal ----------------------------------------------------------------------------


def oracle_mrope(tables, deltas, num_prompt, positions, owners):
    """``[3][N]``: per token, the table column, the shifted completion position, or the last column."""
    rows = [[], [], []]
    for x, i in zip(positions, owners):
        table = tables[i]
        cols = 0 if table is None else len(table[0])
        if cols == 0:
            col = [x, x, x]
        elif x < num_prompt[i] and x < cols:
            col = [table[d][x] for d in range(3)]
        elif x >= num_prompt[i]:
            col = [x + (deltas[i] or 0)] * 3
        else:
            col = [table[d][cols - 1] for d in range(3)]
        for d in range(3):
            rows[d].append(col[d])
    return rows


def oracle_prompt_embeds(embeds, positions, owners, base):
    """Rows of ``base`` (lists), with row ``x`` of the owner's embeds where it has one."""
    out = [list(r) for r in base]
    for k, (x, i) in enumerate(zip(positions, owners)):
        e = embeds.get(i)
        if e is not None and x < len(e):
            out[k] = list(e[x])
    return out


def _features_hit(req_positions, feature):
    """(local index, offset in feature) of the tokens inside the feature's window."""
    lo, n = feature.mm_position.offset, feature.mm_position.length
    return [(k, x - lo) for k, x in enumerate(req_positions) if lo <= x < lo + n]


def _is_embed(feature):
    m = feature.mm_position.is_embed
    return None if m is None else [bool(v) for v in m.tolist()]


def oracle_local_mm_schedule(req_ids, requests, positions, counts, cache):
    scheduled, needed, start = {}, set(), 0
    for req_id, k in zip(req_ids, counts):
        if k <= 0:
            start += k
            continue
        mine = list(positions[start : start + k])
        missing = []
        for f_idx, f in enumerate(requests[req_id].mm_features):
            hits = _features_hit(mine, f)
            mask = _is_embed(f)
            if mask is not None:
                hits = [(k_, r) for k_, r in hits if mask[r]]
            if not hits:
                continue
            needed.add(f.identifier)
            if f.identifier not in cache:
                missing.append(f_idx)
        if missing:
            scheduled[req_id] = missing
        start += k
    return scheduled, needed


def oracle_mm_embeddings(req_ids, requests, positions, counts, shift, cache):
    """(list of per-token embedding rows in emitted order, is_mm_embed) - token by token."""
    is_mm = [False] * sum(counts)
    rows_out = []
    start = 0
    for req_id, k in zip(req_ids, counts):
        mine = [x + shift for x in positions[start : start + k]]
        taken = {}  # local index -> embedding row; the first feature to claim a token wins
        for f in requests[req_id].mm_features:
            mask = _is_embed(f)
            for k_, r in _features_hit(mine, f):
                if mask is not None and not mask[r]:
                    continue
                if k_ in taken:
                    continue
                slot = r if mask is None else sum(mask[: r + 1]) - 1
                taken[k_] = cache[f.identifier][slot]
        rows_out += [taken[k_] for k_ in sorted(taken)]  # in local token order
        for k_ in taken:
            is_mm[start + k_] = True
        start += k
    return rows_out, is_mm

"""Random scheduler batches for the development checks against the reference (hypothesis).

Decodes first (1 .. 1 + spec tokens, with context and the prompt done), then
fresh, chunked and long prefills; every request schedules at least one token
(the reference's update_tokens_for_pcp cannot take an empty prefill).
"""

from __future__ import annotations

from hypothesis import strategies as st


@st.composite
def reference_batches(draw, pcp_sizes=(2, 3, 4, 8), max_reqs=12, max_context=50):
    """``(P, spec, R, T, num_scheduled, num_computed, num_prompt)``."""
    P = draw(st.sampled_from(pcp_sizes))
    spec = draw(st.integers(0, 2))
    R = draw(st.integers(1, max_reqs))
    T = draw(st.integers(8, 200))
    nd = draw(st.integers(0, R))
    npf = draw(st.integers(0 if nd else 1, R - nd))
    sched, comp, prompt = [], [], []
    budget = T
    for _ in range(nd):
        n = draw(st.integers(1, 1 + spec))
        if n > budget:
            break
        budget -= n
        c = draw(st.integers(1, max_context))
        sched.append(n)
        comp.append(c)
        prompt.append(draw(st.integers(0, c)))
    for _ in range(npf):
        if budget < 1:
            break
        n = draw(st.integers(1, min(budget, 60)))
        budget -= n
        kind = draw(st.sampled_from(["fresh", "chunked", "long"]))
        if kind == "fresh":
            c, p = 0, n + draw(st.integers(0, 5))
        elif kind == "chunked":
            c = draw(st.integers(1, max_context))
            p = c + n + draw(st.integers(0, 5))
        else:  # has context but more tokens than a decode may have (or the prompt is not done)
            c = draw(st.integers(1, max_context))
            p = draw(st.integers(0, c))
            if n <= 1 + spec:
                p = c + 1
        sched.append(n)
        comp.append(c)
        prompt.append(p)
    if not sched:
        sched, comp, prompt = [1], [0], [1]
    return P, spec, max(R, len(sched)), T, sched, comp, prompt

"""Hypothesis strategies: random scheduler batches in the runner's order (decodes first)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

PCP_SIZES = (1, 2, 3, 4, 8)


@dataclass
class Case:
    P: int
    spec: int
    R: int
    T: int
    sched: list[int]
    comp: list[int]
    prompt: list[int]

    @property
    def num_reqs(self) -> int:
        return len(self.sched)


@st.composite
def cases(draw, pcp_sizes=PCP_SIZES, max_reqs=10, max_tokens=160, allow_empty=True):
    """Decodes (1..1+spec tokens, some empty), then fresh, chunked and empty prefills.

    Sometimes the batch holds exactly ``R`` requests and/or exactly ``T`` tokens.
    """
    P = draw(st.sampled_from(pcp_sizes))
    spec = draw(st.integers(0, 2))
    R = draw(st.integers(1, max_reqs))
    T = draw(st.integers(1, max_tokens))
    n_reqs = R if draw(st.booleans()) else draw(st.integers(0, R))
    n_dec = draw(st.integers(0, n_reqs))
    sched, comp, prompt = [], [], []
    budget = T
    for _ in range(n_dec):
        lo = 0 if allow_empty and draw(st.integers(0, 9)) == 0 else 1
        n = min(draw(st.integers(lo, 1 + spec)), budget)
        budget -= n
        c = draw(st.integers(1, 600))
        sched.append(n)
        comp.append(c)
        prompt.append(draw(st.integers(0, c)))
    for _ in range(n_reqs - n_dec):
        kind = draw(
            st.sampled_from(
                ["fresh", "chunked", "long", "empty"] if allow_empty else ["fresh", "chunked", "long"]
            )
        )
        n = 0 if kind == "empty" else min(draw(st.integers(1, 70)), budget)
        budget -= n
        if kind in ("fresh", "empty"):
            c, p = 0, n + draw(st.integers(0, 5))
        elif kind == "chunked":  # prompt not done yet
            c = draw(st.integers(1, 300))
            p = c + n + draw(st.integers(1, 5))
        else:  # prompt done but more tokens than a decode may have, or prompt not done
            c = draw(st.integers(1, 300))
            p = draw(st.integers(0, c)) if n > 1 + spec else c + 1
        sched.append(n)
        comp.append(c)
        prompt.append(p)
    # fill the token budget exactly through the last prefill with tokens
    if budget and draw(st.booleans()):
        for i in range(len(sched) - 1, n_dec - 1, -1):
            if sched[i] > 0:
                sched[i] += budget
                if comp[i] and prompt[i] > comp[i]:
                    prompt[i] += budget
                break
    return Case(P, spec, R, T, sched, comp, prompt)

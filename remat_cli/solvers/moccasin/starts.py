"""Starting points of the MOCCASIN CP (none are from the paper; see the "Starting points" note
in :mod:`.model`): compute sequences mapped onto retention intervals, cut to C_v copies
(`repair_sequence`), brought under the budget by splitting intervals (`lower_peak`), the staged
eviction heuristic, and the CP-SAT hint of a solution."""

from __future__ import annotations

import bisect
import time

from remat_cli.solvers.moccasin.model import Interval, Model


def _intervals_of_sequence(m: Model, seq: list[int], events: list[int]) -> list[list[Interval]]:
    """Retention intervals for local compute sequence `seq` run at `events`: each production is
    retained until its last reader before the next production of the same node (§2, Fig. 3),
    and a kept output's last production until the end."""
    H = m.space.horizon
    n = len(m.nodes)
    out: list[list[Interval]] = [[] for _ in range(n)]
    open_: dict[int, list[int]] = {}  # node -> [start, last use]
    for k, t in zip(seq, events, strict=True):
        for u in m.preds[k]:
            if u in open_:
                open_[u][1] = t
        if k in open_:
            st, last = open_.pop(k)
            out[k].append((st, last + 1))
        open_[k] = [t, t]
    for k, (st, last) in open_.items():
        out[k].append((st, H + 1 if m.keep[k] else last + 1))
    for lst in out:
        lst.sort()
    return out


def map_sequence(m: Model, seq: list[int]) -> list[list[Interval]] | None:
    """Place a local compute sequence in the time domain; None when it does not fit.

    Staged (§2.3): the first computations must follow the input order; a recomputation belongs
    to the stage of the next first computation, where copies run in node order (reordering
    nodes within a stage keeps dependencies, since the input order is topological).
    """
    sp = m.space
    if not sp.staged:
        return _intervals_of_sequence(m, seq, list(range(1, len(seq) + 1)))
    seen: set[int] = set()
    stages: list[set[int]] = []
    pending: set[int] = set()
    for k in seq:
        if k in seen:
            pending.add(k)
            continue
        if k != len(stages):
            return None  # first computations out of the input order
        seen.add(k)
        pending.discard(k)
        stages.append(pending)
        pending = set()
    if len(stages) != sp.n or pending:
        return None
    new_seq: list[int] = []
    events: list[int] = []
    for j, rec in enumerate(stages, start=1):
        for k in sorted(rec) + [j - 1]:
            new_seq.append(k)
            events.append(sp.event(k, j))
    return _intervals_of_sequence(m, new_seq, events)


def repair_sequence(m: Model, seq: list[int], cap: int) -> list[int] | None:
    """Fit a compute sequence from elsewhere (``--hint``, `greedy`) into the search space.

    Not from the paper: another solver may compute a node more than C_v times, which makes its
    schedule useless as a hint. Dropping a recomputation of v (never the first computation)
    keeps the sequence valid — v's readers use the previous copy, retained longer — at the price
    of memory. The excess copies are dropped one at a time, each time the one whose removal
    gives the lowest peak (eq. (4)); then recomputations that the budget does not need are
    dropped too, costliest first, while the peak stays within `cap` (or does not rise, when it
    was over). None when the first computations do not follow the input order (staged domain).
    """
    ivs = map_sequence(m, seq)
    if ivs is None:
        return None
    seq = list(seq)
    peak = folded_peak(m, ivs)

    def recomputations(v: int | None = None) -> list[int]:
        seen: set[int] = set()
        out = []
        for p, k in enumerate(seq):
            if k in seen and (v is None or k == v):
                out.append(p)
            seen.add(k)
        return out

    def peak_without(p: int) -> int | None:
        trial = map_sequence(m, seq[:p] + seq[p + 1 :])
        return None if trial is None else folded_peak(m, trial)

    counts: dict[int, int] = {}
    for k in seq:
        counts[k] = counts.get(k, 0) + 1
    for v, c in sorted(counts.items()):
        for _ in range(c - m.space.copies[v]):
            options = [(pk, p) for p in recomputations(v) if (pk := peak_without(p)) is not None]
            if not options:
                return None
            peak, p = min(options)
            del seq[p]
    order = sorted(recomputations(), key=lambda p: (-m.w[seq[p]], p))
    for idx, p in enumerate(order):
        pk = peak_without(p)
        if pk is not None and pk <= max(cap, peak):
            peak = pk
            del seq[p]
            order[idx + 1 :] = [q - (q > p) for q in order[idx + 1 :]]
    return seq


def _peak_excess(m: Model, ivs: list[list[Interval]], cap: int) -> tuple[int, int, int]:
    """(peak, total excess over `cap` summed over the compute events, event of the peak)."""
    changes: dict[int, int] = {}
    events: set[int] = set()
    for k, lst in enumerate(ivs):
        for st, en in lst:
            changes[st] = changes.get(st, 0) + m.mem[k] + m.ws[k]
            changes[st + 1] = changes.get(st + 1, 0) - m.ws[k]
            changes[en] = changes.get(en, 0) - m.mem[k]
            events.add(st)
    level = peak = excess = 0
    at = -1
    for t in sorted(changes):
        level += changes[t]
        if t in events:
            excess += max(0, level - cap)
            if level > peak:
                peak, at = level, t
    return peak, excess, at


def lower_peak(
    m: Model, seq: list[int], cap: int, deadline: float | None, max_steps: int = 10**9
) -> list[int] | None:
    """Bring a start a little over the budget within it by splitting retention intervals.

    Not from the paper; a fast stand-in for phase 1 (§2.4) on near-feasible starts, which keeps
    their cost low where phase 1, blind to the duration, adds many recomputations. At the event
    of highest memory (eq. (4)), every output retained across it but not read there, with a copy
    left, is a candidate: recomputing it right before its next reader ends its interval earlier
    (its inputs are retained longer instead). The candidate lowering the memory over the budget
    (summed over the events) the most per unit of duration is applied, until the peak fits `cap`;
    None when stuck or out of time.
    """
    ivs = map_sequence(m, seq)
    if ivs is None or not within_copies(m, ivs):
        return None
    seq = sequence_of(ivs)
    peak, excess, t_peak = _peak_excess(m, ivs, cap)
    for _ in range(max_steps):
        if peak <= cap:
            return seq
        if deadline is not None and time.monotonic() > deadline:
            return None
        starts = sorted(st for lst in ivs for st, _ in lst)
        pos = bisect.bisect_left(starts, t_peak)
        node = seq[pos]
        best: tuple[float, list[list[Interval]], tuple[int, int, int]] | None = None
        for k, lst in enumerate(ivs):
            if k == node or k in m.preds[node] or len(lst) >= m.space.copies[k]:
                continue
            if not any(st < t_peak < en for st, en in lst):
                continue
            q = next((i for i in range(pos + 1, len(seq)) if k in m.preds[seq[i]]), None)
            if q is None:
                continue
            t_ivs = map_sequence(m, seq[:q] + [k] + seq[q:])
            if t_ivs is None or not within_copies(m, t_ivs):
                continue
            res = _peak_excess(m, t_ivs, cap)
            gain = (excess - res[1]) / (m.w[k] + 1)
            if res[1] < excess and (best is None or gain > best[0]):
                best = (gain, t_ivs, res)
        if best is None:
            return None
        _, ivs, (peak, excess, t_peak) = best
        seq = sequence_of(ivs)
    return seq if peak <= cap else None


def staged_eviction(m: Model, cap: int, score: int, max_chain: int) -> list[int] | None:
    """A memory-feasible starting point inside the staged space (not from the paper).

    Phase 1 (§2.4) exists because no easy feasible solution is known, and on tight budgets
    CP-SAT spends most of its time there. This walks the stages in order; when an event would
    exceed `cap` it drops a retained output not needed in the rest of the stage (its interval
    then ends right after its last use so far). Candidates are outputs whose recomputation
    needs at most `max_chain` other outputs that are not retained; the one dropped maximises
    m·d/(w + w_chain + 1) (score 0), m·d/(w_chain + 1) (1) or m/(w_chain + 1) (2), with d the
    distance to its next reader and w_chain the cost of that chain. A dropped output that is
    read later is *pending*: it is recomputed (with its chain) in the stage of its next reader,
    in node order, so at most C_v computations are ever needed. When nothing can be dropped the
    event goes over `cap`, and the result can only start phase 1. CP-SAT gets it as a hint.
    """
    n = m.space.n
    consumers: list[list[int]] = [[] for _ in range(n)]
    for v in range(n):
        for u in m.preds[v]:
            consumers[u].append(v)
    for c in consumers:
        c.sort()
    live: set[int] = set()
    pending: set[int] = set()
    level = 0
    count = [0] * n
    seq: list[int] = []

    def next_use(x: int, j: int, memo: dict[int, int]) -> int:
        """The stage of x's next reader (through pending outputs); -1 when none, n+1 if kept."""
        if x in memo:
            return memo[x]
        best = n + 1 if m.keep[x] else -1
        for c in consumers[x]:
            if c > j:
                best = c if best < 0 else min(best, c)
                break
        for c in consumers[x]:
            if c in pending:
                t = next_use(c, j, memo)
                if t >= 0:
                    best = t if best < 0 else min(best, t)
        memo[x] = best
        return best

    for j in range(n):
        need: set[int] = set()
        stack = [j]
        while stack:
            for p in m.preds[stack.pop()]:
                if p not in live and p not in need:
                    need.add(p)
                    stack.append(p)
        stage = sorted(need) + [j]
        for pos, r in enumerate(stage):
            if count[r] >= m.space.copies[r]:
                return None
            pinned = {p for q in stage[pos:] for p in m.preds[q]}
            memo: dict[int, int] = {}
            while level + m.mem[r] + m.ws[r] > cap:
                best, best_key, best_revive = -1, -1.0, set()
                for x in live:
                    if x in pinned or m.keep[x] or count[x] >= m.space.copies[x]:
                        continue
                    # Inputs of x that are not retained must be recomputed with it (those freed
                    # for good are revived as pending); long chains can pile up into one stage.
                    chain: set[int] = set()
                    stack = [x]
                    while stack and len(chain) <= max_chain:
                        for p in m.preds[stack.pop()]:
                            if p not in live and p not in chain:
                                chain.add(p)
                                stack.append(p)
                    if len(chain) > max_chain or any(count[p] >= m.space.copies[p] for p in chain):
                        continue
                    revive = {p for p in chain if p not in pending}
                    dist = next_use(x, j, memo) - j
                    extra = sum(m.w[p] for p in chain)
                    if score == 0:
                        key = m.mem[x] * dist / (m.w[x] + extra + 1)
                    elif score == 1:
                        key = m.mem[x] * dist / (extra + 1)
                    else:
                        key = m.mem[x] / (extra + 1)
                    if key > best_key or (key == best_key and x < best):
                        best, best_key, best_revive = x, key, revive
                if best < 0:
                    break  # stuck: go over `cap` here; the result can still start phase 1
                pending |= best_revive
                live.discard(best)
                pending.add(best)
                level -= m.mem[best]
                memo.clear()
            seq.append(r)
            count[r] += 1
            pending.discard(r)
            live.add(r)
            level += m.mem[r]
            # outputs nobody reads any more (in this stage, later, or through a pending output)
            # are freed right after this event
            still = {p for q in stage[pos + 1 :] for p in m.preds[q]}
            memo = {}
            for x in [x for x in live if x not in still and next_use(x, j, memo) < 0]:
                live.discard(x)
                level -= m.mem[x]
    return seq


def within_copies(m: Model, ivs: list[list[Interval]]) -> bool:
    return all(len(x) <= m.space.copies[k] for k, x in enumerate(ivs))


def folded_peak(m: Model, ivs: list[list[Interval]]) -> int:
    """Peak of eq. (4) for these intervals (in gcd units), i.e. what the cumulative sees."""
    changes: dict[int, int] = {}
    for k, lst in enumerate(ivs):
        for st, en in lst:
            changes[st] = changes.get(st, 0) + m.mem[k] + m.ws[k]
            changes[st + 1] = changes.get(st + 1, 0) - m.ws[k]
            changes[en] = changes.get(en, 0) - m.mem[k]
    level = peak = 0
    for t in sorted(changes):
        level += changes[t]
        peak = max(peak, level)
    return peak


def sequence_of(ivs: list[list[Interval]]) -> list[int]:
    return [k for _, k in sorted((st, k) for k, lst in enumerate(ivs) for st, _ in lst)]


def set_hint(m: Model, ivs: list[list[Interval]], peak: int) -> None:
    """Give CP-SAT a complete hint (every variable), so it starts from this solution."""
    m.model.clear_hints()
    n = m.space.n
    for k in range(len(m.nodes)):
        for i in range(m.space.copies[k]):
            if i < len(ivs[k]):
                (st, en), on = ivs[k][i], 1
            else:
                st, on = m.absent[k][i], 0
                en = st + 1
            if m.stage[k][i] is not None:
                m.model.add_hint(m.stage[k][i], st // n)
            elif not isinstance(m.s[k][i], int):
                m.model.add_hint(m.s[k][i], st)
            if not isinstance(m.a[k][i], int):
                m.model.add_hint(m.a[k][i], on)
            m.model.add_hint(m.e[k][i], en)
            m.model.add_hint(m.size[k][i], en - st)
    for u, j, v, i, c in m.cover:
        on = j < len(ivs[u]) and i < len(ivs[v]) and ivs[u][j][0] < ivs[v][i][0] < ivs[u][j][1]
        m.model.add_hint(c, int(on))
    m.model.add_hint(m.m_var, max(peak, m.m_var.proto.domain[0]))  # M_var ≥ M, eq. (12)

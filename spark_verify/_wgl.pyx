# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled loop of the per-key linearizability search (spark_verify/wgl.py).

``spark_verify.wgl._search`` stays the reference: it simplifies a key's ops
(refusals that always have a place, unobserved info writes, deadlines of
observed writes), then runs Wing & Gong's search with Lowe's cache of seen
configurations.  This module runs that same loop, step for step, over C
arrays instead of Python objects:

- states are small integers (wgl.py interns each value; 0 is "no value"), and
  each op's step is a code and one or two of those integers (read, write or
  delete, cas, refused cas);
- the set of linearized ops is a bitset over the ops in the order of their
  invokes, kept canonical as (lo, words lo..hi): every word below ``lo`` is
  full, so a configuration stores only the words where the search is (its
  window of concurrent ops), not the whole key;
- the cache is an open-addressing hash table keyed by a Zobrist hash of the
  set (one random word per op, XORed in and out as ops are linearized and
  undone) mixed with the state; its slots and the stored windows are counted
  against a memory bound, and a search that would pass it stops, undecided,
  saying how far it got.

As the loop and the cache's equality are the reference's, both explore the
same configurations in the same order: the same verdict, the same number of
states and the same blocking op (tests/spark_verify/test_wgl_compiled.py
checks that on generated histories).

``pure_python_requested``: ``KQ_PURE_PYTHON`` is set (and not ``0``) in the
environment; wgl.py then leaves this module unused (as partition_log does
with its own extension).
"""

from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcmp, memcpy

import os as _os

_pure = _os.environ.get("KQ_PURE_PYTHON", "")
pure_python_requested = _pure != "" and _pure != "0"

READ = 0
WRITE = 1
CAS = 2
REFUSED = 3

cdef enum:
    # The bytes of one slot of the cache (hash, state, lo, length, offset).
    SLOT_BYTES = 8 + 8 + 4 + 4 + 8


cdef inline uint64_t _mix(uint64_t z) noexcept nogil:
    # splitmix64's finalizer (Steele, Lea & Flood 2014)
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef struct Table:
    uint64_t *hash
    int64_t *state
    int32_t *lo
    int32_t *length
    int64_t *offset
    int64_t cap
    int64_t count
    uint64_t *arena
    int64_t arena_len
    int64_t arena_cap
    int64_t max_bytes


cdef inline int64_t _table_bytes(int64_t cap, int64_t arena_cap) noexcept nogil:
    return cap * SLOT_BYTES + arena_cap * 8


cdef int _table_init(Table *t, int64_t max_bytes) noexcept nogil:
    t.cap = 1024
    t.count = 0
    t.max_bytes = max_bytes
    t.hash = <uint64_t *> calloc(t.cap, sizeof(uint64_t))
    t.state = <int64_t *> malloc(t.cap * sizeof(int64_t))
    t.lo = <int32_t *> malloc(t.cap * sizeof(int32_t))
    t.length = <int32_t *> malloc(t.cap * sizeof(int32_t))
    t.offset = <int64_t *> malloc(t.cap * sizeof(int64_t))
    t.arena_cap = 4096
    t.arena_len = 0
    t.arena = <uint64_t *> malloc(t.arena_cap * sizeof(uint64_t))
    if (t.hash == NULL or t.state == NULL or t.lo == NULL or t.length == NULL
            or t.offset == NULL or t.arena == NULL):
        return -1
    return 0


cdef void _table_free(Table *t) noexcept nogil:
    free(t.hash)
    free(t.state)
    free(t.lo)
    free(t.length)
    free(t.offset)
    free(t.arena)


cdef int _table_grow(Table *t) noexcept nogil:
    """Double the slots; -1 past the memory bound or out of memory."""
    cdef int64_t cap = t.cap * 2
    if _table_bytes(cap, t.arena_cap) > t.max_bytes:
        return -1
    cdef uint64_t *hash = <uint64_t *> calloc(cap, sizeof(uint64_t))
    cdef int64_t *state = <int64_t *> malloc(cap * sizeof(int64_t))
    cdef int32_t *lo = <int32_t *> malloc(cap * sizeof(int32_t))
    cdef int32_t *length = <int32_t *> malloc(cap * sizeof(int32_t))
    cdef int64_t *offset = <int64_t *> malloc(cap * sizeof(int64_t))
    if hash == NULL or state == NULL or lo == NULL or length == NULL or offset == NULL:
        free(hash)
        free(state)
        free(lo)
        free(length)
        free(offset)
        return -1
    cdef int64_t k, s, mask = cap - 1
    for k in range(t.cap):
        if t.hash[k] == 0:
            continue
        s = <int64_t> (t.hash[k] & <uint64_t> mask)
        while hash[s] != 0:
            s = (s + 1) & mask
        hash[s] = t.hash[k]
        state[s] = t.state[k]
        lo[s] = t.lo[k]
        length[s] = t.length[k]
        offset[s] = t.offset[k]
    _table_free_slots(t)
    t.hash, t.state, t.lo, t.length, t.offset = hash, state, lo, length, offset
    t.cap = cap
    return 0


cdef void _table_free_slots(Table *t) noexcept nogil:
    free(t.hash)
    free(t.state)
    free(t.lo)
    free(t.length)
    free(t.offset)


cdef int _table_add(
    Table *t, uint64_t key, int64_t state, int32_t lo, int32_t length, uint64_t *words
) noexcept nogil:
    """Add the configuration: 1 if it is new, 0 if it was there, -1 past the bound."""
    cdef int64_t mask = t.cap - 1
    cdef int64_t s = <int64_t> (key & <uint64_t> mask)
    while t.hash[s] != 0:
        if (t.hash[s] == key and t.state[s] == state and t.lo[s] == lo
                and t.length[s] == length
                and memcmp(t.arena + t.offset[s], words, length * sizeof(uint64_t)) == 0):
            return 0
        s = (s + 1) & mask
    cdef int64_t need = t.arena_len + length
    cdef int64_t arena_cap
    cdef uint64_t *arena
    if need > t.arena_cap:
        arena_cap = t.arena_cap * 2
        while arena_cap < need:
            arena_cap *= 2
        if _table_bytes(t.cap, arena_cap) > t.max_bytes:
            return -1
        arena = <uint64_t *> realloc(t.arena, arena_cap * sizeof(uint64_t))
        if arena == NULL:
            return -1
        t.arena = arena
        t.arena_cap = arena_cap
    memcpy(t.arena + t.arena_len, words, length * sizeof(uint64_t))
    t.hash[s] = key
    t.state[s] = state
    t.lo[s] = lo
    t.length[s] = length
    t.offset[s] = t.arena_len
    t.arena_len = need
    t.count += 1
    if t.count * 2 > t.cap:
        if _table_grow(t) != 0:
            return -1
    return 1


def search(
    list events,
    list kinds,
    list a,
    list b,
    list required,
    object clock,
    double deadline,
    long long max_bytes,
    long long clock_every,
):
    """Wing & Gong's search over ops given by their steps (see the module docstring).

    ``events``: the ops' calls and returns in time order, each ``op`` for a
    call and ``~op`` for a return; ops are numbered in the order of their
    calls.  ``kinds``, ``a``, ``b``: each op's step (READ a, WRITE a, CAS a
    to b, REFUSED a) over interned states; ``required``: whether it must be
    linearized.  The loop calls ``clock`` every ``clock_every`` steps, as
    the reference does, and stops once it is past ``deadline``.  Returns ``(outcome, states, blocker, depth, bytes)``:
    outcome 1 linearizable, 0 not (``blocker`` is the op whose return the
    deepest partial linearization could not pass), -1 the clock passed
    ``deadline``, -2 the cache would pass ``max_bytes``; ``depth`` is the
    deepest partial linearization's size, ``bytes`` the cache's size.
    """
    cdef int64_t n = len(kinds)
    cdef int64_t size = 2 * n + 2
    cdef int64_t words_n = (n + 63) // 64
    cdef int64_t i, j, e, m, entry, w
    cdef int64_t *op_of = <int64_t *> malloc(size * sizeof(int64_t))
    cdef char *is_call = <char *> calloc(size, 1)
    cdef int64_t *match = <int64_t *> malloc(size * sizeof(int64_t))
    cdef int64_t *nxt = <int64_t *> malloc(size * sizeof(int64_t))
    cdef int64_t *prv = <int64_t *> malloc(size * sizeof(int64_t))
    cdef int64_t *ret_entry = <int64_t *> malloc((n + 1) * sizeof(int64_t))
    cdef int *kind = <int *> malloc((n + 1) * sizeof(int))
    cdef int64_t *va = <int64_t *> malloc((n + 1) * sizeof(int64_t))
    cdef int64_t *vb = <int64_t *> malloc((n + 1) * sizeof(int64_t))
    cdef char *req = <char *> malloc(n + 1)
    cdef uint64_t *zob = <uint64_t *> malloc((n + 1) * sizeof(uint64_t))
    cdef uint64_t *words = <uint64_t *> calloc(words_n + 1, sizeof(uint64_t))
    cdef uint64_t *full = <uint64_t *> malloc((words_n + 1) * sizeof(uint64_t))
    cdef int64_t *stack_entry = <int64_t *> malloc((n + 1) * sizeof(int64_t))
    cdef int64_t *stack_state = <int64_t *> malloc((n + 1) * sizeof(int64_t))
    cdef Table table
    cdef int table_ok = _table_init(&table, max_bytes)
    if (op_of == NULL or is_call == NULL or match == NULL or nxt == NULL or prv == NULL
            or ret_entry == NULL or kind == NULL or va == NULL or vb == NULL or req == NULL
            or zob == NULL or words == NULL or full == NULL or stack_entry == NULL
            or stack_state == NULL or table_ok != 0):
        _release(op_of, is_call, match, nxt, prv, ret_entry, kind, va, vb, req, zob, words,
                 full, stack_entry, stack_state)
        _table_free(&table)
        raise MemoryError("linearizability search: cannot allocate its arrays")
    cdef int64_t remaining = 0
    cdef uint64_t seed = 0x2545F4914F6CDD1DULL
    try:
        for i in range(n):
            kind[i] = kinds[i]
            va[i] = a[i]
            vb[i] = b[i]
            req[i] = 1 if required[i] else 0
            remaining += req[i]
            seed = _mix(seed + 0x9E3779B97F4A7C15ULL)
            zob[i] = seed
        for w in range(words_n):
            full[w] = 0xFFFFFFFFFFFFFFFFULL
        if n % 64:
            full[words_n - 1] = (1ULL << (n % 64)) - 1
        op_of[0] = -1
        op_of[size - 1] = -1
        for e in range(1, size - 1):
            i = events[e - 1]
            if i >= 0:
                is_call[e] = 1
                op_of[e] = i
            else:
                op_of[e] = ~i
                ret_entry[~i] = e
        for e in range(1, size - 1):
            if is_call[e]:
                match[e] = ret_entry[op_of[e]]
        for e in range(size):
            nxt[e] = e + 1
            prv[e] = e - 1
    except BaseException:
        _release(op_of, is_call, match, nxt, prv, ret_entry, kind, va, vb, req, zob, words,
                 full, stack_entry, stack_state)
        _table_free(&table)
        raise

    cdef int64_t depth = 0, best_depth = -1, blocker = -1
    cdef int64_t state = 0, new
    cdef uint64_t h = 0, key, bit
    cdef int32_t lo = 0, hi = -1, old_lo, old_hi, length
    cdef int64_t countdown = clock_every
    cdef int outcome = 2, added, legal
    entry = nxt[0]
    if remaining == 0:
        outcome = 1
    while outcome == 2:
        countdown -= 1
        if countdown == 0:
            countdown = clock_every
            if clock() > deadline:
                outcome = -1
                break
        i = op_of[entry]
        if is_call[entry]:
            legal = 1
            if kind[i] == 0:
                new = state
                legal = state == va[i]
            elif kind[i] == 1:
                new = va[i]
            elif kind[i] == 2:
                new = vb[i]
                legal = state == va[i]
            else:
                new = state
                legal = state != va[i]
            if legal:
                w = i >> 6
                bit = 1ULL << (i & 63)
                words[w] |= bit
                old_lo, old_hi = lo, hi
                if w == lo:
                    while lo < words_n and words[lo] == full[lo]:
                        lo += 1
                if w > hi:
                    hi = <int32_t> w
                length = hi - lo + 1 if hi >= lo else 0
                key = _mix((h ^ zob[i]) + <uint64_t> new * 0x9E3779B97F4A7C15ULL)
                if key == 0:
                    key = 1
                added = _table_add(&table, key, new, lo, length, words + lo)
                if added < 0:
                    outcome = -2
                    break
                if added == 1:
                    h ^= zob[i]
                    stack_entry[depth] = entry
                    stack_state[depth] = state
                    depth += 1
                    state = new
                    if req[i]:
                        remaining -= 1
                        if remaining == 0:
                            outcome = 1
                            break
                    m = match[entry]
                    nxt[prv[entry]] = nxt[entry]
                    prv[nxt[entry]] = prv[entry]
                    nxt[prv[m]] = nxt[m]
                    prv[nxt[m]] = prv[m]
                    entry = nxt[0]
                    continue
                words[w] &= ~bit
                lo, hi = old_lo, old_hi
            entry = nxt[entry]
            continue
        if i < 0:
            _release(op_of, is_call, match, nxt, prv, ret_entry, kind, va, vb, req, zob,
                     words, full, stack_entry, stack_state)
            _table_free(&table)
            raise AssertionError("linearizability search ran past the last return")
        if depth > best_depth:
            best_depth = depth
            blocker = i
        if depth == 0:
            outcome = 0
            break
        depth -= 1
        entry = stack_entry[depth]
        state = stack_state[depth]
        j = op_of[entry]
        h ^= zob[j]
        w = j >> 6
        words[w] &= ~(1ULL << (j & 63))
        if w < lo:
            lo = <int32_t> w
        if w == hi and words[w] == 0:
            while hi >= 0 and words[hi] == 0:
                hi -= 1
        if req[j]:
            remaining += 1
        m = match[entry]
        nxt[prv[m]] = m
        prv[nxt[m]] = m
        nxt[prv[entry]] = entry
        prv[nxt[entry]] = entry
        entry = nxt[entry]
    states = table.count
    memory = _table_bytes(table.cap, table.arena_cap)
    if outcome == 1:
        blocker = -1
    _release(op_of, is_call, match, nxt, prv, ret_entry, kind, va, vb, req, zob, words, full,
             stack_entry, stack_state)
    _table_free(&table)
    return outcome, states, blocker, max(best_depth, depth), memory


cdef void _release(
    int64_t *op_of, char *is_call, int64_t *match, int64_t *nxt, int64_t *prv,
    int64_t *ret_entry, int *kind, int64_t *va, int64_t *vb, char *req, uint64_t *zob,
    uint64_t *words, uint64_t *full, int64_t *stack_entry, int64_t *stack_state,
) noexcept:
    free(op_of)
    free(is_call)
    free(match)
    free(nxt)
    free(prv)
    free(ret_entry)
    free(kind)
    free(va)
    free(vb)
    free(req)
    free(zob)
    free(words)
    free(full)
    free(stack_entry)
    free(stack_state)

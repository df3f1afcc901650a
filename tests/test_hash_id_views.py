"""`simulator.hash_ids.HashIds`: a read-only view of ids shared by the calls of a task, that reads like a tuple."""

from __future__ import annotations

import pickle
import random

import pytest

from simulator.hash_ids import ID_LIMIT, BadHashId, HashIds, common_prefix, share_calls


def test_reads_like_the_tuple_it_holds():
    ids = (5, 6, 7, 10, 11, 3)
    view = HashIds.of(ids)
    assert len(view) == 6 and tuple(view) == ids and list(view) == list(ids)
    assert view == ids and ids == view and view != ids[:-1] and hash(view) == hash(ids)
    assert view[0] == 5 and view[3] == 10 and view[-1] == 3 and view[1:4] == (6, 7, 10) and view[::2] == (5, 7, 11)
    assert 10 in view and 8 not in view and view.index(11) == 4 and view.count(7) == 1
    assert view + (1,) == ids + (1,) and (1,) + view == (1,) + ids and sorted([view, ids[:2]])[0] == ids[:2]
    assert bool(view) and not HashIds.of(()) and pickle.loads(pickle.dumps(view)) == view
    with pytest.raises(IndexError):
        view[6]


def test_consecutive_ids_are_stored_as_runs_and_a_run_costs_the_same_at_any_length():
    view = HashIds.run(1000, 10**7)
    assert len(view) == 10**7 and view[123_456] == 124_456 and list(view.runs()) == [(1000, 10**7)]
    mixed = HashIds.of(list(range(10, 60)) + [3] + list(range(100, 200)))
    assert list(mixed.runs()) == [(10, 50), (3, 1), (100, 100)]


def test_extending_shares_the_chain_and_a_rewrite_starts_a_new_one():
    first = HashIds.of((1, 2, 3))
    second = first.extend(3, (4, 5))
    third = second.extend(5, range(100, 110))
    assert second == (1, 2, 3, 4, 5) and third[:5] == second and len(third) == 15
    assert first._chain is second._chain is third._chain and first == (1, 2, 3)  # the older views are unchanged
    branch = second.extend(2, (9,))  # keeps part of the previous call: its own chain
    assert branch == (1, 2, 9) and branch._chain is not second._chain and third[:5] == (1, 2, 3, 4, 5)
    again = first.extend(3, (7,))  # first no longer ends where its chain does
    assert again == (1, 2, 3, 7) and again._chain is not first._chain


def test_only_ints_in_the_id_range_are_ids():
    for bad in ([True], [0, False], [1.0], ["a"], [None], [-1], [ID_LIMIT], [5, 6, -3], list(range(100)) + [2.5]):
        with pytest.raises(BadHashId):
            HashIds.of(bad)
    assert HashIds.of([0, 1, ID_LIMIT - 1]) == (0, 1, ID_LIMIT - 1)


def test_common_prefix_agrees_with_a_plain_count():
    rng = random.Random(3)
    for _ in range(300):
        a = [rng.randrange(6) for _ in range(rng.randrange(12))]
        b = a[: rng.randrange(len(a) + 1)] + [rng.randrange(6) for _ in range(rng.randrange(5))]
        plain = 0
        for x, y in zip(a, b):
            if x != y:
                break
            plain += 1
        for left, right in ((a, b), (HashIds.of(a), HashIds.of(b)), (tuple(a), HashIds.of(b))):
            assert common_prefix(left, right) == plain == common_prefix(right, left)


def test_share_calls_gives_each_call_its_ids():
    rng = random.Random(5)
    for _ in range(500):
        keeps, lists, whole, previous = [], [], [], []
        for i in range(rng.randrange(1, 7)):
            keep = 0 if i == 0 else rng.choice([len(previous), rng.randrange(len(previous) + 1)])
            start = rng.randrange(50)
            new = [abs(start + k * rng.choice([1, 1, 1, 2, -3])) for k in range(rng.randrange(7))]
            keeps.append(keep)
            lists.append(list(new))
            previous = previous[:keep] + new
            whole.append(tuple(previous))
        views = share_calls(keeps, lists)
        assert [tuple(v) for v in views] == whole
        for i in range(1, len(views)):  # a call that extends the previous one whole shares its chain
            if keeps[i] == len(whole[i - 1]) and views[i] and views[i - 1]:
                assert views[i]._chain is views[i - 1]._chain


def test_share_calls_names_the_call_and_position_of_a_bad_id():
    with pytest.raises(BadHashId) as err:
        share_calls([0, 2], [[1, 2], [3, True]])
    assert err.value.index == (1, 1) and "item 1" in str(err.value)


def test_views_pickle_with_one_copy_of_their_chain():
    """Workloads go to Ray workers pickled: the views of a chain must not become a copy each."""
    first = HashIds.of(range(100, 600, 3))
    second = first.extend(len(first), range(10, 20))
    first.as_tuple()
    a, b = pickle.loads(pickle.dumps((first, second)))
    assert a == first and b == second and a._chain is b._chain and a._chain.whole is None


def test_as_tuple_gives_the_ids_and_reuses_the_chains_tuple():
    from simulator.hash_ids import as_tuple

    whole = HashIds.of(tuple(range(50)) + (7, 8))
    part = whole[:30]
    assert as_tuple(part) == tuple(range(30)) and as_tuple(whole) == tuple(range(50)) + (7, 8)
    assert as_tuple(whole) is as_tuple(whole) and as_tuple(part, 10) == tuple(range(10))
    assert as_tuple((1, 2, 3), 2) == (1, 2) and as_tuple([4, 5]) == (4, 5)

"""The recorder's task grouping (`simulator.recorder.grouping`): each rule that places a call, the checks of
timing's guesses, keys, compacting and forgetting, and the grouping of generated agent traffic."""

from __future__ import annotations

import numpy as np
import pytest
from grouping_replay import Clock, events, group, replay, score
from recorder_runs import agent_workload

from simulator.recorder.block_hash import block_ids
from simulator.recorder.grouping import Placement, TaskGrouper
from simulator.recorder.prompt_tree import MIXED, PromptTree

SYSTEM = (1, 40)
"""A system prompt: 40 blocks of content 1."""


def prompt(*parts: tuple[int, int]) -> list[int]:
    """Chained block ids of a prompt made of `parts`: (content seed, full 16-token blocks) each."""
    tokens = [np.random.default_rng(seed).integers(10, 30000, 16 * blocks) for seed, blocks in parts]
    return block_ids(np.concatenate(tokens))


def ended(grouper: TaskGrouper, t: float, key, ids, took: float = 1.0) -> Placement:
    """Place a call at `t` and end it `took` seconds later."""
    placed = grouper.place(t, key, ids)
    grouper.end(placed.task, placed.index, t + took, 10)
    return placed


# -- rule 1: extends ---------------------------------------------------------------------------------------


def test_a_prompt_extending_a_waiting_chain_continues_it():
    g = TaskGrouper()
    first = ended(g, 0.0, None, prompt((10, 20)))
    second = g.place(3.0, None, prompt((10, 20), (11, 5)))
    assert first == Placement("t1", 0)
    assert second == Placement("t1", 1, evidence="extends")


def test_the_last_blocks_of_the_previous_prompt_may_differ_up_to_the_tolerance():
    # a replay fills what follows the last trace block with fresh tokens: the next prompt drops them
    g = TaskGrouper(tolerance=3)
    first = ended(g, 0.0, None, prompt((10, 20), (12, 3)))
    within = ended(g, 3.0, None, prompt((10, 20), (13, 8)))
    assert (within.task, within.evidence) == (first.task, "extends")
    beyond = g.place(6.0, None, prompt((10, 20), (13, 4), (14, 6)))  # drops 4 of the 28 blocks: no extension
    assert (beyond.task, beyond.evidence) == (first.task, "prefix")


def test_the_longest_prompt_extended_wins_then_the_chain_that_ended_last():
    g = TaskGrouper()
    base = g.place(0.0, None, prompt((10, 20)))
    longer = ended(g, 0.5, None, prompt((10, 20), (11, 10)))  # sent while the first is in flight
    g.end(base.task, base.index, 1.0, 10)
    assert longer.parent == base.task
    extending_both = g.place(5.0, None, prompt((10, 20), (11, 10), (12, 3)))
    assert (extending_both.task, extending_both.evidence) == (longer.task, "extends")

    g = TaskGrouper()
    one = g.place(0.0, None, prompt((10, 20)))
    two = g.place(0.0, None, prompt((10, 20)))  # the same prompt sent twice at once
    g.end(two.task, two.index, 1.0, 10)
    g.end(one.task, one.index, 1.5, 10)
    after = g.place(4.0, None, prompt((10, 20), (11, 4)))
    assert after.task == one.task  # ended last


def test_a_chain_with_a_call_in_flight_takes_no_other_call():
    g = TaskGrouper()
    first = g.place(0.0, None, prompt((10, 20)))
    parallel = g.place(0.1, None, prompt((10, 20), (11, 2)))
    assert parallel == Placement("t1/s1", 0, parent=first.task, after_call=-1, evidence="prefix")


def test_a_failed_call_frees_its_chain_for_the_retry():
    g = TaskGrouper()
    first = g.place(0.0, None, prompt((10, 20)))
    g.failed(first.task, first.index, 1.0)
    retry = g.place(2.0, None, prompt((10, 20)))
    assert retry == Placement(first.task, 1, evidence="extends")


# -- rule 2: prefix ----------------------------------------------------------------------------------------


def test_a_prompt_sharing_a_prefix_right_after_the_end_forks_a_sub_task():
    g = TaskGrouper(spawn_window=0.05)
    parent = ended(g, 0.0, None, prompt((10, 20)))
    ended(g, 1.5, None, prompt((10, 20), (11, 30)))
    fork = g.place(2.52, None, prompt((10, 20), (11, 10), (12, 15)))
    assert fork == Placement("t1/s1", 0, parent=parent.task, after_call=1, evidence="prefix")


def test_a_prompt_sharing_a_prefix_later_continues_the_chain_whose_context_was_cut_back():
    g = TaskGrouper(spawn_window=0.05)
    parent = ended(g, 0.0, None, prompt((10, 20)))
    ended(g, 1.5, None, prompt((10, 20), (11, 30)))
    cut_back = g.place(5.0, None, prompt((10, 20), (11, 10), (12, 15)))
    assert cut_back == Placement(parent.task, 2, evidence="prefix")


def test_a_prefix_that_two_tasks_share_is_no_evidence():
    g = TaskGrouper()
    k1 = ended(g, 0.0, "k1", prompt(SYSTEM, (20, 20)))
    ended(g, 0.0, "k2", prompt(SYSTEM, (21, 20)))
    unkeyed = g.place(5.0, None, prompt(SYSTEM, (22, 20)))
    assert unkeyed == Placement("t3", 0)
    extending = g.place(5.0, None, prompt(SYSTEM, (20, 20), (23, 4)))
    assert (extending.task, extending.evidence) == (k1.task, "extends")


def test_a_prefix_shorter_than_a_tasks_first_prompt_forks_a_sub_task_once():
    # before a second task shares it, a system prompt looks like the first task's own: taken once, then suspect
    g = TaskGrouper()
    first = g.place(0.0, None, prompt(SYSTEM, (20, 20)))
    second = g.place(1.0, None, prompt(SYSTEM, (21, 20)))
    third = g.place(2.0, None, prompt(SYSTEM, (22, 20)))
    assert (second.parent, second.evidence) == (first.task, "prefix")
    assert third == Placement("t2", 0)


def test_a_context_cut_back_twice_to_the_same_point_continues_its_chain():
    g = TaskGrouper()
    first = ended(g, 0.0, None, prompt((10, 20), (11, 30)))
    once = ended(g, 5.0, None, prompt((10, 20), (12, 12)))  # keeps less than its first prompt: the run is suspect
    twice = g.place(10.0, None, prompt((10, 20), (13, 12)))
    assert once == Placement(first.task, 1, evidence="prefix")
    assert twice == Placement(first.task, 2, evidence="prefix")


def test_a_suspect_prefix_continues_no_chain_that_was_not_cut_back_there():
    # sub-agents start with a prompt of their own kind: the second one shares it with the first
    sub_prompt = (2, 30)
    g = TaskGrouper(spawn_window=0.05)
    parent = ended(g, 0.0, None, prompt((11, 20)), took=1.0)
    first_sub = ended(g, 1.01, None, prompt(sub_prompt, (30, 10)))
    second_sub = ended(g, 1.02, None, prompt(sub_prompt, (31, 10)))
    assert (first_sub.evidence, second_sub.evidence) == ("timing", "prefix")
    ended(g, 3.0, None, prompt((11, 20), (12, 2)), took=1.0)
    third_sub = g.place(4.01, None, prompt(sub_prompt, (32, 10)))
    assert (third_sub.parent, third_sub.evidence) == (parent.task, "timing")


# -- rule 3: timing, and its guesses checked --------------------------------------------------------------


def test_a_fresh_prompt_right_after_an_end_is_a_sub_agent_of_the_chain_that_ended_last():
    g = TaskGrouper(spawn_window=0.05)
    ended(g, 0.0, None, prompt((10, 20)), took=0.98)
    parent = ended(g, 0.0, None, prompt((11, 20)), took=1.0)
    sub = g.place(1.01, None, prompt((30, 20)))
    late = g.place(1.2, None, prompt((31, 20)))
    assert sub == Placement("t2/s1", 0, parent=parent.task, after_call=0, evidence="timing")
    assert late == Placement("t3", 0)


def test_a_guessed_parent_that_goes_on_while_the_sub_task_runs_is_replaced():
    g = TaskGrouper(spawn_window=0.05)
    other = ended(g, 0.0, None, prompt((10, 20)), took=0.98)
    guessed = ended(g, 0.0, None, prompt((11, 20)), took=1.0)
    sub = g.place(1.01, None, prompt((30, 20)))
    assert sub.parent == guessed.task and g.revisions() == []
    g.place(1.5, None, prompt((11, 20), (12, 2)))  # the guessed parent goes on: sub's call is in flight
    assert g.revisions() == [Placement(sub.task, 0, parent=other.task, after_call=0, evidence="timing")]
    g.end(sub.task, 0, 2.0, 10)
    g.place(2.5, None, prompt((10, 20), (13, 2)))  # the next candidate goes on while sub waits between calls
    assert g.revisions() == []
    g.place(3.0, None, prompt((30, 20), (31, 2)))  # and sub sends another call: not that one's either
    assert g.revisions() == [Placement(sub.task, 0)]


def test_a_parent_that_waits_for_its_sub_agent_keeps_it():
    g = TaskGrouper(spawn_window=0.05)
    parent = ended(g, 0.0, None, prompt((11, 20)), took=1.0)
    sub = ended(g, 1.01, None, prompt((30, 20)))
    ended(g, 2.5, None, prompt((30, 20), (31, 3)))
    ended(g, 4.0, None, prompt((11, 20), (12, 2)))  # the parent goes on after its sub-agent's last call
    g.close()
    assert sub.parent == parent.task and g.revisions() == []


def test_a_guess_whose_parent_never_goes_on_becomes_a_task_at_the_close():
    g = TaskGrouper(spawn_window=0.05)
    ended(g, 0.0, None, prompt((11, 20)), took=1.0)  # its last call
    sub = ended(g, 1.01, None, prompt((30, 20)))
    ended(g, 2.5, None, prompt((30, 20), (31, 3)))
    assert g.revisions() == []
    g.close()
    assert g.revisions() == [Placement(sub.task, 0)]


# -- keys ----------------------------------------------------------------------------------------------


def test_calls_with_one_key_are_one_task_and_other_keys_other_tasks():
    g = TaskGrouper(spawn_window=0.05)
    first = ended(g, 0.0, "session-a", prompt((10, 20)))
    unrelated = g.place(5.0, "session-a", prompt((40, 20)))
    same_prompt = g.place(5.0, "session-b", prompt((10, 20), (11, 3)))
    assert unrelated == Placement("t1/s1", 0, parent=first.task, after_call=0, evidence="key")
    assert same_prompt == Placement("t2", 0)
    g.close()
    assert g.revisions() == []


# -- memory ----------------------------------------------------------------------------------------------


def test_a_waiting_chain_is_compacted_then_forgotten():
    g = TaskGrouper(compact_after=100.0, idle_timeout=1000.0)
    first = ended(g, 0.0, None, prompt((10, 20)))
    ended(g, 150.0, None, prompt((50, 20)))
    assert (g.held_prompts, g.live_chains) == (1, 2)  # the first one's prompt left the tree
    resumed = ended(g, 200.0, None, prompt((10, 20), (11, 4)))
    assert resumed == Placement(first.task, 1, evidence="extends") and g.held_prompts == 2
    later = g.place(2000.0, None, prompt((10, 20), (11, 4), (12, 4)))
    assert later == Placement("t3", 0) and g.live_chains == 1


def test_a_keyed_task_outlasts_the_compacting_of_its_chains():
    g = TaskGrouper(compact_after=100.0, idle_timeout=10**5)
    first = ended(g, 0.0, "k", prompt((10, 20)))
    back = g.place(5000.0, "k", prompt((60, 20)))
    assert (back.parent, back.evidence) == (first.task, "key")


def test_settings_out_of_range_are_refused():
    with pytest.raises(ValueError):
        TaskGrouper(idle_timeout=0)
    with pytest.raises(ValueError):
        TaskGrouper(spawn_window=-1)


# -- the prompt tree ---------------------------------------------------------------------------------------


def test_the_prompt_tree_keeps_a_growing_prompt_as_one_run():
    tree, ids = PromptTree(), prompt((10, 400))
    for end in range(20, 401, 20):  # each prompt drops the last 3 blocks of the one before
        tree.put("chain", tuple(ids[:end - 3]) + (end,) * 3 if end < 400 else tuple(ids), "task")
    assert len(tree.path(tuple(ids))) == 1 and tree.walk(tuple(ids)) == (400, tree.root.children[ids[0]])


def test_the_prompt_tree_marks_runs_that_two_groups_share():
    tree, shared = PromptTree(), prompt(SYSTEM)
    one, two = tuple(prompt(SYSTEM, (20, 5))), tuple(prompt(SYSTEM, (21, 5)))
    tree.put("a", one, "task-1")
    tree.put("b", two, "task-2")
    depth, node = tree.walk(tuple(prompt(SYSTEM, (22, 5))))
    assert depth == len(shared) and node.owner is MIXED
    assert tree.owner_at(one, len(one)) == "task-1"
    tree.drop("b")
    tree.drop("a")
    assert tree.root.children == {} and tree.root.ref == 0


# -- generated agent traffic ------------------------------------------------------------------------------


def test_generated_agent_traffic_is_grouped_into_its_tasks():
    # tasks with sub-agents, replayed as `agentload run` sends them (benchmarks/recorder_grouping.py has more)
    calls = replay(agent_workload(60, 2.0, seed=3), Clock(), seed=3)
    unkeyed = score(calls, group(calls, events(calls), keys=False))
    keyed = score(calls, group(calls, events(calls), keys=True))
    assert unkeyed["subs"] > 150  # (3,429 calls: 98.8% right, 189 of 191 sub-agents found, 5 made wrongly)
    assert unkeyed["right"] >= 0.98 and unkeyed["found"] >= 0.97 * unkeyed["subs"] and unkeyed["wrong"] <= 6
    assert keyed["right"] == 1.0 and keyed["found"] == keyed["subs"] and keyed["wrong"] <= 6

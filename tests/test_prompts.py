"""The prompt builder: exact lengths, shared prefixes exactly where hash ids are shared."""

import pytest

from simulator.behaviour import CallRequest
from simulator.live.prompts import WORDS, PromptBuilder, TextCalibration, calibrate_text
from simulator.workload import Call


def req(task="t", index=0, attempt=0, tokens=100, hash_ids=(), block=16):
    return CallRequest(task, "c", index, Call(input_tokens=tokens, output_tokens=4, hash_ids=tuple(hash_ids), block_size=block), attempt)


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.parametrize("tokens,hash_ids", [(1, ()), (100, ()), (100, (1, 2, 3)), (40, (1, 2, 3, 4, 5)), (64, (1, 2, 3, 4))])
def test_exact_length_and_range(tokens, hash_ids):
    builder = PromptBuilder(vocab_size=1000)
    ids = builder.token_ids(req(tokens=tokens, hash_ids=hash_ids))
    assert len(ids) == tokens
    assert all(10 <= i < 990 for i in ids)


def test_json_form_matches_ids():
    import json

    builder = PromptBuilder(vocab_size=1000)
    r = req(tokens=77, hash_ids=(5, 6, 7, 8, 9))
    assert json.loads(builder.token_ids_json(r)) == builder.token_ids(r)
    assert json.loads(builder.token_ids_json(req(tokens=0))) == []


def test_shared_hash_ids_share_exactly_their_blocks():
    builder = PromptBuilder(vocab_size=1000)
    a = builder.token_ids(req("a", tokens=100, hash_ids=(1, 2, 3, 4)))
    b = builder.token_ids(req("b", tokens=120, hash_ids=(1, 2, 9, 4)))
    assert a[:32] == b[:32]
    assert a[32:48] != b[32:48]
    # a block is the same wherever and by whomever it is used
    c = PromptBuilder(vocab_size=1000).token_ids(req("c", 3, tokens=16, hash_ids=(1,)))
    assert c == a[:16]


def test_tails_are_unique_per_task_call_and_attempt():
    builder = PromptBuilder(vocab_size=1000)
    base = builder.token_ids(req("a", 0, 0, tokens=200, hash_ids=(1, 2)))
    for other in (req("b", 0, 0, tokens=200, hash_ids=(1, 2)), req("a", 1, 0, tokens=200, hash_ids=(1, 2)), req("a", 0, 1, tokens=200, hash_ids=(1, 2))):
        ids = builder.token_ids(other)
        assert common_prefix(base, ids) < 40  # 32 shared tokens plus at most a chance match
        assert ids[:32] == base[:32]
    assert builder.token_ids(req("a", 0, 0, tokens=200, hash_ids=(1, 2))) == base  # deterministic


def test_disjoint_hash_ids_share_nothing():
    builder = PromptBuilder(vocab_size=1000)
    a = builder.token_ids(req("a", tokens=64, hash_ids=(1, 2, 3, 4)))
    b = builder.token_ids(req("b", tokens=64, hash_ids=(5, 6, 7, 8)))
    assert common_prefix(a, b) < 3


def test_no_sharing_when_share_prefixes_false():
    builder = PromptBuilder(vocab_size=1000, share_prefixes=False)
    a = builder.token_ids(req("a", tokens=64, hash_ids=(1, 2, 3, 4)))
    b = builder.token_ids(req("b", tokens=64, hash_ids=(1, 2, 3, 4)))
    assert len(a) == len(b) == 64
    assert common_prefix(a, b) < 3


def test_truncates_hash_blocks_beyond_the_prompt():
    builder = PromptBuilder(vocab_size=1000)
    full = builder.token_ids(req("a", tokens=64, hash_ids=(1, 2, 3, 4)))
    short = builder.token_ids(req("b", tokens=24, hash_ids=(1, 2, 3, 4)))
    assert short == full[:24]


def test_block_cache_is_bounded():
    builder = PromptBuilder(vocab_size=1000, cache_blocks=8)
    builder.token_ids(req(tokens=16 * 20, hash_ids=range(20)))
    assert len(builder._blocks) == 8


def test_text_shares_word_blocks_and_hits_the_budget():
    cal = TextCalibration(word_costs=(1,) * len(WORDS), overhead_tokens=7, source="test")
    builder = PromptBuilder(calibration=cal)
    a = builder.text(req("a", tokens=107, hash_ids=(1, 2, 3, 4))).split()
    b = builder.text(req("b", tokens=107, hash_ids=(1, 2, 9))).split()
    assert len(a) == len(b) == 100
    assert a[:32] == b[:32] and a[32:48] != b[32:48]
    assert all(w in WORDS for w in a)


def text_cost(text, costs):
    index = {w: i for i, w in enumerate(WORDS)}
    return sum(costs[index[w]] for w in text.split())


@pytest.mark.parametrize("tokens,hash_ids", [(1000, ()), (333, (1, 2, 3)), (40, (5, 6, 7, 8, 9))])
def test_text_adds_up_to_exact_tokens_with_uneven_word_costs(tokens, hash_ids):
    costs = tuple(1 + i % 3 for i in range(len(WORDS)))  # 1, 2 or 3 tokens a word
    builder = PromptBuilder(calibration=TextCalibration(word_costs=costs, overhead_tokens=5, source="test"))
    text = builder.text(req(tokens=tokens, hash_ids=hash_ids))
    assert text.startswith(" ")  # every word keeps its space, so its cost is context free
    assert text_cost(text, costs) == tokens - 5


def test_shared_text_blocks_cost_exactly_their_tokens():
    costs = tuple(1 + i % 4 for i in range(len(WORDS)))
    builder = PromptBuilder(calibration=TextCalibration(word_costs=costs, overhead_tokens=0, source="test"))
    a = builder.text(req("a", tokens=64, hash_ids=(1, 2, 3, 4)))
    b = builder.text(req("b", tokens=64, hash_ids=(1, 2, 8, 9)))
    shared = builder.text(req("c", tokens=32, hash_ids=(1, 2)))
    assert a.startswith(shared) and b.startswith(shared)
    assert text_cost(shared, costs) == 32


def test_long_prompts_without_hash_ids_are_exact_and_unique_from_the_start():
    builder = PromptBuilder(vocab_size=1000)
    a = builder.token_ids(req("a", tokens=10_000))
    b = builder.token_ids(req("b", tokens=10_000))
    assert len(a) == len(b) == 10_000
    assert common_prefix(a, b) < 3
    assert all(10 <= i < 990 for i in a)
    import json

    assert json.loads(builder.token_ids_json(req("a", tokens=10_000))) == a


def test_long_text_tail_has_the_calibrated_length():
    builder = PromptBuilder()
    a = builder.text(req("a", tokens=5_000, hash_ids=(1, 2))).split()
    b = builder.text(req("b", tokens=5_000, hash_ids=(1, 2))).split()
    assert len(a) == len(b) == 5_000
    assert a[:32] == b[:32] and common_prefix(a[32:], b[32:]) < 5


async def test_calibration_measures_each_word():
    costs = {w: 1 + len(w) // 4 for w in WORDS}

    async def tokenize(body):
        if "messages" in body:
            content = body["messages"][0]["content"]
            return {"count": 9 + sum(costs[w] for w in content.split())}
        return {"count": costs[body["prompt"].strip()]}

    cal = await calibrate_text(tokenize, "m")
    assert cal.source == "tokenize" and cal.overhead_tokens == 9
    assert cal.word_costs == tuple(costs[w] for w in WORDS)
    assert cal.check is not None and cal.check[0] == cal.check[1]


async def test_calibration_falls_back_without_tokenize():
    async def tokenize(body):
        return None

    cal = await calibrate_text(tokenize, None)
    assert cal.source == "assumed" and cal.tokens_per_word == 1.0

"""The prefix index (pd_operator.proxy.prefix_index): chained block keys, salts, bounded memory with
eviction, lookup cost, departure, two layouts at once. Pure."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from pd_operator.proxy import prefix_index
from pd_operator.proxy.prefix_index import PrefixIndex, block_keys, root_key, tokens_key


def test_keys_are_whole_blocks_chained_from_the_first():
    tokens = list(range(10))
    keys = block_keys(tokens, 4)
    assert len(keys) == 2  # the partial last block (2 tokens) is never cached: no key
    assert keys[0] == tokens_key(root_key(4, ""), tokens[:4])
    assert keys[1] == tokens_key(keys[0], tokens[4:8])
    # A key stands for the whole prefix: the same second block after another first block differs.
    assert block_keys([9, 9, 9, 9, *tokens[4:8]], 4)[1] != keys[1]
    assert block_keys(tokens[:8], 4) == keys
    assert block_keys(tokens[:3], 4) == []
    with pytest.raises(ValueError, match="block_tokens"):
        block_keys(tokens, 0)


def test_ids_key_by_value_as_vllm_reads_them_and_an_unhashable_one_ends_the_keys():
    # vLLM's request model reads 1.0 and true as the id 1 (pydantic's lax int), and so do the keys;
    # a string it reads as an id too, but the keys only miss it.
    ones = block_keys([1] * 8, 4)
    assert block_keys([1, 1.0, True, 1] * 2, 4) == ones
    assert block_keys(["1"] * 8, 4)[0] != ones[0]
    # A list inside the ids (vLLM rejects the prompt) ends its keys before that block.
    assert block_keys([1] * 4 + [1, [2], 1, 1], 4) == ones[:1]
    assert block_keys(list(range(8)), 4) == block_keys(tuple(range(8)), 4)


def test_keys_do_not_depend_on_the_process():
    # Ints and tuples of ints hash alike in every process (only str and bytes hashes are seeded), and
    # the root is a digest: another process with another hash seed computes the same keys.
    code = ("from pd_operator.proxy.prefix_index import block_keys; "
            "print(block_keys(list(range(10**6, 10**6 + 40)), 8, 'salt'))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": "12345"},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(block_keys(list(range(10**6, 10**6 + 40)), 8, "salt"))


def test_different_salts_and_block_sizes_never_share_a_key():
    tokens = [7] * 64
    plain, salted = block_keys(tokens, 16), block_keys(tokens, 16, "key-a")
    other = block_keys(tokens, 16, "key-b")
    assert not set(plain) & set(salted) and not set(salted) & set(other)
    # The same tokens hashed for a layout of 32-token blocks share nothing with 16-token ones, even
    # where the first 32 tokens are one block of one and two of the other.
    assert not set(block_keys(tokens, 32)) & set(plain)
    index = PrefixIndex(100)
    index.store("p0", salted)
    assert index.hits(plain, ["p0"]) == {"p0": 0}
    assert index.hits(other, ["p0"]) == {"p0": 0}
    assert index.hits(salted, ["p0"]) == {"p0": 4}


def test_hits_count_from_the_first_block_to_the_first_miss():
    keys = block_keys(list(range(40)), 8)  # 5 blocks
    index = PrefixIndex(100)
    index.store("a", keys[:3])
    index.store("b", keys)
    index.store("c", keys[1:])  # holds later blocks but not the first: no prefix
    assert index.hits(keys, ["a", "b", "c", "d"]) == {"a": 3, "b": 5, "c": 0, "d": 0}
    index.remove("b", [keys[2]])
    assert index.hits(keys, ["b"]) == {"b": 2}


def test_each_holder_is_bounded_and_evicts_the_least_recent_prefix_tail_first():
    index = PrefixIndex(6)
    first = block_keys([1] * 16, 4)  # 4 blocks
    second = block_keys([2] * 16, 4)
    index.touch("p", first)
    index.touch("p", second)  # 8 blocks for 6: the 2 oldest go, the first prompt's tail first
    assert index.size("p") == 6
    assert index.hits(first, ["p"]) == {"p": 2}
    assert index.hits(second, ["p"]) == {"p": 4}
    index.touch("p", first[:2])  # used again: now the most recent
    index.touch("p", block_keys([3] * 8, 4))
    assert index.hits(first, ["p"]) == {"p": 2}
    assert index.hits(second, ["p"]) == {"p": 2}
    index.set_capacity("p", 1)
    assert index.size("p") == 1 and index.size() == 1
    index.set_capacity("p", 0)
    assert index.size() == 0 and index.holders() == []


def test_memory_stays_within_the_capacities_over_many_prompts():
    rng = random.Random(7)
    index = PrefixIndex(50)
    index.set_capacity("big", 200)
    shared = [rng.randrange(1 << 20) for _ in range(64)]
    for _ in range(500):
        tail = [rng.randrange(1 << 20) for _ in range(rng.randrange(0, 200))]
        tokens = shared[: rng.randrange(0, 64)] + tail
        for holder in ("small", "big"):
            index.touch(holder, block_keys(tokens, 16))
        assert index.size("small") <= 50 and index.size("big") <= 200
    assert index.size("small") == 50 and index.size("big") == 200
    # No key is left without a holder, nor a holder's key missing from the map.
    assert len(index._holders) <= 250
    assert all(holders for holders in index._holders.values())
    assert index.capacity("small") == 50 and index.capacity("big") == 200


def test_capacity_is_capped():
    index = PrefixIndex(prefix_index.MAX_CAPACITY + 5)
    assert index.default_capacity == prefix_index.MAX_CAPACITY
    with pytest.raises(ValueError, match="capacity"):
        index.set_capacity("p", -1)


def test_departure_drops_a_holder_and_its_keys_only():
    keys = block_keys(list(range(32)), 8)
    index = PrefixIndex(100)
    index.store("p0", keys)
    index.store("p1", keys[:2])
    index.set_capacity("p0", 10)
    index.drop("p0")
    assert index.hits(keys, ["p0", "p1"]) == {"p0": 0, "p1": 2}
    assert index.size("p0") == 0 and index.capacity("p0") == 100
    assert index.size() == 2
    # A new holder takes the departed one's place in the map, and nothing it held.
    index.store("p2", keys[:1])
    assert index.hits(keys, ["p0", "p1", "p2"]) == {"p0": 0, "p1": 2, "p2": 1}
    index.drop("p2")
    index.clear("p1")  # a cleared cache keeps its capacity
    assert index.size() == 0 and not index._holders


def test_lookup_cost_does_not_grow_with_what_is_held():
    """hits touches the holder map once per matched block and stops at the first miss: the number of
    map reads is the same with 10 or 100,000 blocks held."""

    class Counting(dict):
        reads = 0

        def get(self, key, default=None):
            Counting.reads += 1
            return super().get(key, default)

    def reads(held_prompts: int) -> int:
        index = PrefixIndex(10_000_000)
        for i in range(held_prompts):
            index.store(f"p{i % 4}", block_keys([i] * 64, 16))
        target = block_keys([1] * 64 + [5] * 64, 16)
        index.store("p1", target[:4])
        index._holders = Counting(index._holders)
        Counting.reads = 0
        assert index.hits(target, ["p0", "p1", "p2", "p3"])["p1"] == 4
        return Counting.reads

    assert reads(10) == reads(25_000) == 5


def test_two_layouts_at_once():
    """During a rollout that changes the block, members of each layout are held in keys of their own
    block size; one prompt is looked up in both."""
    tokens = list(range(1280))
    old, new = block_keys(tokens, 640), block_keys(tokens, 1152)
    index = PrefixIndex(100)
    index.store("old-0", old)
    index.store("new-0", new)
    assert index.hits(old, ["old-0", "new-0"]) == {"old-0": 2, "new-0": 0}
    assert index.hits(new, ["old-0", "new-0"]) == {"old-0": 0, "new-0": 1}

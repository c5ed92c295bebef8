"""Scheduler + KV manager without a model: a fake step appends a deterministic token."""

from latentkv.cache.block_pool import BlockPool
from latentkv.engine.kv_manager import KVManager
from latentkv.engine.scheduler import Scheduler
from latentkv.engine.sequence import Sequence, Status
from latentkv.sampling_params import SamplingParams


def make(num_blocks, block_size=4, max_num_seqs=8, max_tokens_per_step=32, caching=True):
    pool = BlockPool(num_blocks, block_size, enable_prefix_caching=caching)
    return pool, Scheduler(KVManager(pool), max_num_seqs, max_tokens_per_step)


def next_token(seq):
    # depends only on the sequence's own tokens: outputs must not depend on scheduling
    return (sum(seq.token_ids) * 31 + len(seq)) % 97


def run(sched, seqs, targets, check=None):
    for s in seqs:
        sched.add(s)
    steps = 0
    while sched.has_unfinished():
        out = sched.schedule()
        assert out, "scheduler made no progress"
        if check:
            check(out)
        samplers = [s.seq for s in out.scheduled if s.picks_token]
        # the cache must hold every scheduled token's slot
        for s in out.scheduled:
            assert len(s.seq.block_table) * sched.kv.block_size >= s.seq.num_computed_tokens + s.num_new_tokens
        sched.mark_computed(out)
        for seq in samplers:
            seq.append_token(next_token(seq))
            if seq.num_output_tokens >= targets[seq.request_id]:
                seq.finish("length")
                sched.finish(seq)
        steps += 1
        assert steps < 10_000
    return steps


def test_everything_finishes_and_budget_respected():
    pool, sched = make(64, max_num_seqs=3, max_tokens_per_step=10)
    seqs = [Sequence(str(i), list(range(1, 5 + 3 * i)), SamplingParams()) for i in range(6)]
    targets = {s.request_id: 3 + i for i, s in enumerate(seqs)}

    def check(out):
        assert out.num_tokens <= 10
        assert len(sched.running) <= 3

    run(sched, seqs, targets, check)
    assert all(s.num_output_tokens == targets[s.request_id] for s in seqs)
    assert pool.num_free == pool.num_blocks


def reference_outputs(seqs, targets):
    pool, sched = make(256, max_num_seqs=1)
    solo = [Sequence(s.request_id, s.prompt_token_ids, SamplingParams()) for s in seqs]
    for s in solo:
        run(sched, [s], targets)
    return {s.request_id: s.output_token_ids for s in solo}


def test_preemption_changes_nothing_and_frees_all_blocks():
    prompts = [list(range(i, i + 6 + i % 5)) for i in range(8)]
    targets = {str(i): 10 + 2 * i for i in range(8)}
    expected = reference_outputs([Sequence(str(i), p, SamplingParams()) for i, p in enumerate(prompts)], targets)
    for caching in (True, False):
        pool, sched = make(12, block_size=4, max_num_seqs=8, max_tokens_per_step=64, caching=caching)
        seqs = [Sequence(str(i), p, SamplingParams()) for i, p in enumerate(prompts)]
        run(sched, seqs, targets)
        assert sched.num_preemptions > 0
        assert {s.request_id: s.output_token_ids for s in seqs} == expected
        assert pool.num_free == pool.num_blocks
        assert all(b.ref_count == 0 for b in pool.blocks)


def test_preempts_newest_first():
    pool, sched = make(4, block_size=2, max_num_seqs=4)
    a = Sequence("a", [1, 2, 3], SamplingParams())
    b = Sequence("b", [4, 5, 6], SamplingParams())
    sched.add(a), sched.add(b)
    out = sched.schedule()
    sched.mark_computed(out)
    assert [s.seq for s in out.scheduled] == [a, b] and pool.num_free == 0
    a.append_token(9), b.append_token(9)  # both now need a third block... 4 tokens fit in 2
    a.append_token(9), b.append_token(9)
    a.num_computed_tokens += 1
    b.num_computed_tokens += 1
    out = sched.schedule()  # a needs a new block: b (newest) is preempted
    assert out.preempted == [b] and b.status is Status.WAITING and sched.waiting[0] is b
    assert [s.seq for s in out.scheduled] == [a]


def test_chunked_prefill_and_prefix_hits():
    pool, sched = make(32, block_size=4, max_tokens_per_step=5)
    shared = list(range(100, 112))  # three full blocks
    first = Sequence("x", shared + [1, 2], SamplingParams())
    run(sched, [first], {"x": 2})
    second = Sequence("y", shared + [3], SamplingParams())
    sched.add(second)
    out = sched.schedule()
    assert second.num_cached_tokens == 12 and out.scheduled[0].num_new_tokens == 1
    assert pool.prefix_hits >= 3
    # a prompt that is exactly the shared blocks keeps its last block to compute
    third = Sequence("z", list(shared), SamplingParams())
    pool2, sched2 = make(32, block_size=4)
    run(sched2, [Sequence("w", list(shared), SamplingParams())], {"w": 1})
    sched2.add(third)
    out = sched2.schedule()
    assert third.num_cached_tokens == 8 and out.scheduled[0].num_new_tokens == 4


def test_partial_block_not_shared():
    pool, sched = make(32, block_size=4)
    a = Sequence("a", [1, 2, 3, 4, 5, 6], SamplingParams())
    run(sched, [a], {"a": 1})
    b = Sequence("b", [1, 2, 3, 4, 5, 7, 8], SamplingParams())
    sched.add(b)
    sched.schedule()
    assert b.num_cached_tokens == 4  # only the full first block; [5, 6] vs [5, 7] never shared


def check_pool_invariants(pool, sched):
    """Every block's ref count equals the number of live block tables holding it, and
    exactly the unreferenced blocks are on the free list."""
    refs = [0] * pool.num_blocks
    for seq in list(sched.running) + list(sched.waiting):
        for b in seq.block_table:
            refs[b] += 1
    assert refs == [b.ref_count for b in pool.blocks]
    assert set(pool.free_ids) == {i for i, r in enumerate(refs) if r == 0}
    for h, i in pool.hash_to_id.items():
        assert pool.blocks[i].hash == h


def test_random_arrivals_and_aborts_keep_invariants():
    import random

    rng = random.Random(0)
    pool, sched = make(20, block_size=4, max_num_seqs=6, max_tokens_per_step=16)
    shared = [rng.randrange(100) for _ in range(8)]
    live, targets, finished, n = [], {}, 0, 0
    for step in range(400):
        if rng.random() < 0.3:
            prompt = (shared if rng.random() < 0.5 else []) + [rng.randrange(100) for _ in range(rng.randint(1, 20))]
            seq = Sequence(str(n), prompt, SamplingParams())
            targets[seq.request_id] = rng.randint(1, 40 - len(prompt))  # whole sequence fits the 80-token cache
            sched.add(seq)
            live.append(seq)
            n += 1
        if live and rng.random() < 0.05:
            victim = live.pop(rng.randrange(len(live)))
            victim.finish("abort")
            sched.finish(victim)
        out = sched.schedule()
        assert out or not sched.has_unfinished()
        sched.mark_computed(out)
        for s in out.scheduled:
            if s.picks_token:
                s.seq.append_token(next_token(s.seq))
                if s.seq.num_output_tokens >= targets[s.seq.request_id]:
                    s.seq.finish("length")
                    sched.finish(s.seq)
                    live.remove(s.seq)
                    finished += 1
        check_pool_invariants(pool, sched)
    assert finished > 30 and sched.num_preemptions > 0 and pool.prefix_hits > 0

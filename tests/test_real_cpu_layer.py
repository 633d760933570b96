"""opspatch's CPU kernel layer for real SGLang (`opspatch/sandbox/real/engine_files/sgl_kernel`),
each op against a torch reference: attention against `scaled_dot_product_attention` (with
EAGLE's tree mask), the bookkeeping ops against the Triton kernels' semantics written out.

The layer is loaded under a private name (it is never importable as `sgl_kernel` here), and its
`torch.ops.sgl_kernel` registrations are taken back after the test that makes them.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch
from torch.nn import functional

from opspatch.sandbox.real.release import engine_files_dir

pytestmark = pytest.mark.pure

LAYER = engine_files_dir() / "sgl_kernel"
NAME = "opspatch_cpu_layer_under_test"


def _submodule(name: str) -> ModuleType:
    """`sgl_kernel.<name>` loaded as `NAME.<name>`, without running the package's __init__."""
    if NAME not in sys.modules:
        package = ModuleType(NAME)
        package.__path__ = [str(LAYER)]
        sys.modules[NAME] = package
    full = f"{NAME}.{name}"
    if full not in sys.modules:
        spec = importlib.util.spec_from_file_location(full, LAYER / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
    return sys.modules[full]


attention = _submodule("attention")
speculative = _submodule("speculative")
memory = _submodule("memory")
errors = _submodule("errors")

HEADS, KV_HEADS, DIM = 4, 2, 16
SCALE = DIM**-0.5


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None):
    """The reference: q `[m, H, D]`, k/v `[n, Hkv, D]`, mask `[m, n]` (True: visible)."""
    k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
    v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
    out = functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask
    )
    return out.transpose(0, 1)


def _cache(rows: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(rows, KV_HEADS, DIM), torch.randn(rows, KV_HEADS, DIM)


def _req_to_token(lengths: list[int], pool_len: int = 32) -> torch.Tensor:
    """Each request's tokens on scattered, distinct cache rows; request b is pool row b + 1."""
    table = torch.zeros(len(lengths) + 2, pool_len, dtype=torch.int32)
    rows = torch.randperm(63)[: sum(lengths)] + 1
    at = 0
    for b, length in enumerate(lengths):
        table[b + 1, :length] = rows[at : at + length].int()
        at += length
    return table


def test_decode_attention_matches_sdpa_and_writes_the_new_token() -> None:
    torch.manual_seed(0)
    lengths = [5, 1, 9]
    k_buffer, v_buffer = _cache()
    table = _req_to_token(lengths)
    pool = torch.tensor([1, 2, 3])
    seq_lens = torch.tensor(lengths)
    loc = torch.stack([table[b + 1, n - 1] for b, n in enumerate(lengths)]).long()
    q = torch.randn(3, HEADS, DIM)
    new_k, new_v = torch.randn(3, KV_HEADS, DIM), torch.randn(3, KV_HEADS, DIM)
    out = torch.empty(3, HEADS, DIM)
    attention.decode_attention_cpu(
        q, k_buffer, v_buffer, 1.0, 1.0, out, new_k, new_v, loc, torch.empty(0),
        table, pool, seq_lens, SCALE, 0.0, False, 0, None, None,
    )  # fmt: skip
    assert torch.equal(k_buffer[loc], new_k) and torch.equal(v_buffer[loc], new_v)
    for b, n in enumerate(lengths):
        rows = table[b + 1, :n].long()
        expected = _sdpa(q[b : b + 1], k_buffer[rows], v_buffer[rows], None)
        torch.testing.assert_close(out[b : b + 1], expected)


def _extend(new: list[int], prefix: list[int], tree_mask: torch.Tensor | None, use_k: bool):
    torch.manual_seed(1)
    lengths = [p + n for p, n in zip(prefix, new, strict=True)]
    k_buffer, v_buffer = _cache()
    table = _req_to_token(lengths)
    starts = torch.tensor([sum(new[:b]) for b in range(len(new))])
    q = torch.randn(sum(new), HEADS, DIM)
    k_new, v_new = torch.randn(sum(new), KV_HEADS, DIM), torch.randn(sum(new), KV_HEADS, DIM)
    for b, (p, n) in enumerate(zip(prefix, new, strict=True)):  # as set_kv_buffer wrote them
        rows = table[b + 1, p : p + n].long()
        k_buffer[rows], v_buffer[rows] = (
            k_new[starts[b] : starts[b] + n],
            v_new[starts[b] : starts[b] + n],
        )
    out = torch.empty_like(q)
    attention.extend_attention_cpu(
        q, k_new if use_k else None, v_new if use_k else None, out, k_buffer, v_buffer, 1.0, 1.0,
        table, torch.arange(1, len(new) + 1), torch.tensor(lengths), torch.tensor(new), starts,
        max(new), SCALE, 0.0, False, 0, None, None, tree_mask, True,
    )  # fmt: skip
    return out, q, k_buffer, v_buffer, table, starts, lengths


@pytest.mark.parametrize("use_k", [True, False], ids=["k-given", "k-from-cache"])
def test_extend_attention_matches_causal_sdpa_over_the_prefix(use_k: bool) -> None:
    new, prefix = [3, 1, 4], [0, 6, 2]
    out, q, k_buffer, v_buffer, table, starts, lengths = _extend(new, prefix, None, use_k)
    for b, (p, n) in enumerate(zip(prefix, new, strict=True)):
        rows = table[b + 1, : lengths[b]].long()
        mask = torch.ones(n, p + n, dtype=torch.bool)
        mask[:, p:] = torch.ones(n, n, dtype=torch.bool).tril()
        expected = _sdpa(q[starts[b] : starts[b] + n], k_buffer[rows], v_buffer[rows], mask)
        torch.testing.assert_close(out[starts[b] : starts[b] + n], expected)


def _tree_inputs(topk: int, depth: int, selected: list[int]):
    """EAGLE's tree inputs for one request: group g of candidates (score indices
    `topk + (g - 1) * topk + j` for levels past the first) hangs from score index
    `parents[g] = g - 1`."""
    parents = torch.tensor([[-1] + list(range(topk * (depth - 1)))])
    return parents, torch.tensor([selected])


def _expected_tree(topk: int, selected: list[int]) -> dict[int, int]:
    """Each draft token's parent (0: the root), by position in the tree (1-based)."""
    where = {score: position + 1 for position, score in enumerate(selected)}
    parent = {}
    for position, score in enumerate(selected, start=1):
        group = score // topk
        parent[position] = 0 if group == 0 else where[group - 1]
    return parent


@pytest.mark.parametrize("mode", [speculative.FULL_MASK, speculative.QLEN_ONLY])
def test_build_tree_links_masks_and_positions_follow_the_parents(mode: int) -> None:
    topk, depth, seq_len = 2, 3, 7
    selected = [0, 1, 2, 4, 6]  # two roots' children, then children of score 0, 1 and 2
    n = len(selected) + 1
    parents, chosen = _tree_inputs(topk, depth, selected)
    parent = _expected_tree(topk, selected)
    mask = torch.ones(
        seq_len * n + n * n if mode == speculative.FULL_MASK else n * n, dtype=torch.bool
    )
    positions = torch.empty(n, dtype=torch.long)
    retrieve = torch.full((3, 1, n), -1, dtype=torch.long)
    speculative.build_tree_kernel_efficient_cpu(
        parents, chosen, torch.tensor([seq_len]), mask, positions, retrieve[0], retrieve[1],
        retrieve[2], topk, depth, n, mode,
    )  # fmt: skip

    def ancestors(x: int) -> set[int]:
        found = {x, 0}
        while x:
            x = parent[x]
            found.add(x)
        return found

    rows = mask.view(n, -1)[:, seq_len:] if mode == speculative.FULL_MASK else mask.view(n, n)
    for x in range(n):
        assert {c for c in range(n) if rows[x, c]} == ancestors(x), x
        assert positions[x] == seq_len + len(ancestors(x)) - 1
    children = {x: [c for c in range(1, n) if parent[c] == x] for x in range(n)}
    for x in range(n):  # first child, then its siblings: every child once, in order
        walked, child = [], int(retrieve[1, 0, x])
        while child != -1:
            walked.append(child)
            child = int(retrieve[2, 0, child])
        assert walked == sorted(children[x])
    assert retrieve[0, 0].tolist() == list(range(n))
    if mode == speculative.FULL_MASK:
        assert bool(mask.view(n, -1)[:, :seq_len].all())


def test_extend_attention_with_eagle_tree_mask_matches_sdpa() -> None:
    topk, depth = 2, 2
    selected = [0, 1, 2]
    n = len(selected) + 1
    parents, chosen = _tree_inputs(topk, depth, selected)
    mask = torch.ones(2 * n * n, dtype=torch.bool)  # two requests, the same tree
    retrieve = torch.full((3, 2, n), -1, dtype=torch.long)
    speculative.build_tree_kernel_efficient_cpu(
        parents.repeat(2, 1), chosen.repeat(2, 1), torch.tensor([4, 2]), mask,
        torch.empty(2 * n, dtype=torch.long), retrieve[0], retrieve[1], retrieve[2], topk, depth,
        n, speculative.QLEN_ONLY,
    )  # fmt: skip
    prefix = [4, 2]
    out, q, k_buffer, v_buffer, table, starts, lengths = _extend([n, n], prefix, mask, True)
    assert not bool(mask.view(2, n, n).all()), "the tree must hide some draft tokens"
    for b, p in enumerate(prefix):
        rows = table[b + 1, : lengths[b]].long()
        visible = torch.ones(n, p + n, dtype=torch.bool)
        visible[:, p:] = mask.view(2, n, n)[b]
        expected = _sdpa(q[starts[b] : starts[b] + n], k_buffer[rows], v_buffer[rows], visible)
        torch.testing.assert_close(out[starts[b] : starts[b] + n], expected)


def test_logit_cap_is_applied_before_the_softmax() -> None:
    torch.manual_seed(2)
    q, k, v = (
        torch.randn(2, HEADS, DIM) * 4,
        torch.randn(5, KV_HEADS, DIM) * 4,
        torch.randn(5, KV_HEADS, DIM),
    )
    out = attention.attend(q, k, v, SCALE, 2.0, None)
    kk = k.repeat_interleave(2, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q, kk) * SCALE
    weights = torch.softmax(2.0 * torch.tanh(scores / 2.0), dim=-1)
    expected = torch.einsum("hmn,nhd->mhd", weights, v.repeat_interleave(2, dim=1))
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ({"is_cross_attention": True}, "cross attention"),
        ({"sliding_window": 128}, "a sliding window"),
        ({"sinks": torch.zeros(HEADS)}, "attention sinks"),
    ],
)
def test_an_unprovided_case_names_the_op(case: dict, words: str) -> None:
    call = {"is_cross_attention": False, "sliding_window": 0, "sinks": None, **case}
    with pytest.raises(NotImplementedError, match=f"decode_attention_cpu with {words}"):
        attention.decode_attention_cpu(
            torch.zeros(1, HEADS, DIM), *_cache(), 1.0, 1.0, torch.zeros(1, HEADS, DIM), None,
            None, torch.zeros(1, dtype=torch.long), torch.empty(0), torch.zeros(2, 4, dtype=torch.int32),
            torch.tensor([1]), torch.tensor([1]), SCALE, 0.0, **call,
        )  # fmt: skip


def test_assign_req_to_token_pool_and_extend_cache_locs_are_inverses() -> None:
    table = torch.zeros(4, 16, dtype=torch.int32)
    pool, starts, ends = torch.tensor([2, 0, 3]), torch.tensor([3, 0, 5]), torch.tensor([6, 2, 6])
    locs = torch.tensor([40, 41, 42, 50, 51, 60], dtype=torch.int64)
    memory.assign_req_to_token_pool_cpu(pool, table, starts, ends, locs, 16)
    assert table[2, 3:6].tolist() == [40, 41, 42]
    assert table[0, 0:2].tolist() == [50, 51]
    assert table[3, 5:6].tolist() == [60]
    assert int(table.count_nonzero()) == 6
    back = torch.empty(6, dtype=torch.int64)
    memory.assign_extend_cache_locs_cpu(pool, table, starts, ends, back, 16)
    assert torch.equal(back, locs)


def test_draft_cache_locs_and_draft_decode_rows_agree() -> None:
    """Branch j's step s token is written at out_cache_loc[(b, j, s)] and read back by the
    draft decode at row b * topk + j, position seq_len + s."""
    topk, steps = 2, 3
    table = torch.arange(3 * 32, dtype=torch.int32).view(3, 32)
    pool, seq_lens = torch.tensor([2, 1]), torch.tensor([5, 9])
    out = torch.empty(2 * topk * steps, dtype=torch.int64)
    speculative.assign_draft_cache_locs_contiguous_cpu(pool, table, seq_lens, out, 32, topk, steps)
    rows = speculative.build_draft_decode_metadata_cpu(table, pool, seq_lens, topk, steps, 32)
    assert rows.shape == (2 * topk, 32)
    slots = out.view(2, topk, steps)
    for b in range(2):
        n = int(seq_lens[b])
        for j in range(topk):
            row = rows[b * topk + j]
            assert torch.equal(row[:n], table[int(pool[b]), :n])
            for s in range(steps):
                assert int(row[n + s]) == int(slots[b, j, s])


def test_bonus_tokens_and_accepted_cache_rows() -> None:
    accept_tokens = torch.tensor([[7, 8, 9], [4, 5, 6]])
    bonus = torch.empty(2, dtype=torch.long)
    speculative.fill_bonus_tokens_cpu(accept_tokens, torch.tensor([2, 3]), bonus, 3)
    assert bonus.tolist() == [8, 6]
    packed = torch.full((6,), -7, dtype=torch.int64)
    speculative.fill_accept_out_cache_loc_cpu(
        torch.tensor([[0, 2, -1], [3, -1, -1]]), torch.tensor([10, 11, 12, 13, 14, 15]), packed
    )
    assert packed.tolist() == [10, 12, 13, -7, -7, -7]


def test_copy_all_layer_kv_cache_reads_every_source_before_writing() -> None:
    layers = [torch.arange(40, dtype=torch.float32).view(10, 4) + 100 * i for i in range(2)]
    expected = [layer.clone() for layer in layers]
    src, tgt = torch.tensor([1, 2, 3]), torch.tensor([2, 3, 7])  # overlapping moves
    for layer in expected:
        layer[tgt] = layer[src].clone()
    memory.copy_all_layer_kv_cache_cpu(
        torch.tensor([layer.data_ptr() for layer in layers]),
        torch.tensor([layer.stride(0) * layer.element_size() for layer in layers]),
        tgt,
        src,
    )
    for layer, want in zip(layers, expected, strict=True):
        assert torch.equal(layer, want)


@pytest.mark.parametrize(
    ("target", "accepted"),
    [([5, 6, 9], 2), ([5, 3, 9], 1), ([2, 6, 9], 0)],
    ids=["both", "first", "none"],
)
def test_verify_tree_greedy_accepts_the_matching_chain(target: list[int], accepted: int) -> None:
    """A chain root -> 5 -> 6: the target's prediction after each accepted token decides."""
    candidates = torch.tensor([[1, 5, 6]])
    retrieve_index = torch.tensor([[0, 1, 2]])
    next_token, next_sibling = torch.tensor([[1, 2, -1]]), torch.tensor([[-1, -1, -1]])
    predicts = torch.full((3,), -1, dtype=torch.long)
    accept_index = torch.full((1, 3), -1, dtype=torch.long)
    count = torch.zeros(1, dtype=torch.long)
    speculative.verify_tree_greedy_cpu(
        predicts=predicts, accept_index=accept_index, accept_token_num=count,
        candidates=candidates, retrive_index=retrieve_index, retrive_next_token=next_token,
        retrive_next_sibling=next_sibling, target_predict=torch.tensor([target]),
    )  # fmt: skip
    assert int(count[0]) == accepted
    assert accept_index[0, : accepted + 1].tolist() == list(range(accepted + 1))
    assert predicts[: accepted + 1].tolist() == target[: accepted + 1]


def test_verify_tree_greedy_follows_a_matching_sibling() -> None:
    """root has children 1 (token 4) and 2 (token 5); the target says 5: the sibling is taken."""
    predicts = torch.full((3,), -1, dtype=torch.long)
    accept_index = torch.full((1, 3), -1, dtype=torch.long)
    count = torch.zeros(1, dtype=torch.long)
    speculative.verify_tree_greedy_cpu(
        predicts=predicts, accept_index=accept_index, accept_token_num=count,
        candidates=torch.tensor([[1, 4, 5]]), retrive_index=torch.tensor([[0, 1, 2]]),
        retrive_next_token=torch.tensor([[2, -1, -1]]),
        retrive_next_sibling=torch.tensor([[-1, -1, 1]]),
        target_predict=torch.tensor([[5, 0, 8]]),
    )  # fmt: skip
    assert int(count[0]) == 1 and accept_index[0, :2].tolist() == [0, 2]
    assert predicts.tolist() == [5, -1, 8]


@pytest.fixture
def layer_package() -> Iterator[ModuleType]:
    """The package itself (its __init__ run, under the private name); its torch op
    registrations taken back afterwards."""
    spec = importlib.util.spec_from_file_location(
        "opspatch_cpu_layer_whole", LAYER / "__init__.py", submodule_search_locations=[str(LAYER)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    try:
        yield module
    finally:
        for name in module.TORCH_OPS:
            delattr(torch.ops.sgl_kernel, name)
        for key in [k for k in sys.modules if k.startswith(spec.name)]:
            del sys.modules[key]


def test_an_op_the_layer_lacks_is_named_and_reads_as_absent(layer_package: ModuleType) -> None:
    with pytest.raises(NotImplementedError, match="sgl_kernel.fused_experts_cpu is not provided"):
        _ = layer_package.fused_experts_cpu
    assert not hasattr(layer_package, "convert_weight_packed")  # an AttributeError too
    assert hasattr(torch.ops.sgl_kernel, "decode_attention_cpu")
    assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")  # forward_native paths


def test_sgl_kernel_is_not_importable_from_opspatch() -> None:
    assert importlib.util.find_spec("sgl_kernel") is None

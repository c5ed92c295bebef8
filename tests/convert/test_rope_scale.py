import torch

from latentkv.convert.rope_scale import equalize_rope_pairs


def rotate_pairs(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """RoPE on interleaved pairs: x [..., 2S] turned by angles [S]."""
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def test_pairs_get_balanced_key_and_query_energy_and_every_rotated_score_is_unchanged():
    gen = torch.Generator().manual_seed(0)
    heads, dn, dr, r, d_in = 3, 4, 8, 5, 7
    key_sizes = torch.tensor([1e-3, 1e-3, 1.0, 1.0, 30.0, 30.0, 0.0, 0.0], dtype=torch.float64)  # one empty slot
    w = {
        "q_aug": torch.randn(heads * (dn + dr), d_in + 1, generator=gen, dtype=torch.float64),
        "kv_a_aug": torch.cat(
            [
                torch.randn(r, d_in + 1, generator=gen, dtype=torch.float64),
                torch.randn(dr, d_in + 1, generator=gen, dtype=torch.float64) * key_sizes[:, None],
            ]
        ),
        "kv_b": torch.randn(heads * 6, r, generator=gen, dtype=torch.float64),
    }
    x = torch.cat(
        [torch.randn(500, d_in, generator=gen, dtype=torch.float64), torch.ones(500, 1, dtype=torch.float64)], 1
    )
    xx = x.T @ x / len(x)
    out = equalize_rope_pairs(w, xx, heads)
    assert torch.equal(out["kv_b"], w["kv_b"]) and torch.equal(out["kv_a_aug"][:r], w["kv_a_aug"][:r])
    keys = x @ out["kv_a_aug"][r:].T  # [N, dr]
    queries = (x @ out["q_aug"].T).view(len(x), heads, dn + dr)[..., dn:]
    key_e = keys.pow(2).mean(0).view(-1, 2).sum(1)
    query_e = queries.pow(2).mean(0).sum(0).view(-1, 2).sum(1)
    ratio = key_e[:3] / query_e[:3]  # balanced: the same key-to-query ratio in every live pair
    assert torch.allclose(ratio, ratio.mean().expand(3), rtol=1e-9) and key_e[3] == 0
    before = (x @ w["kv_a_aug"][r:].T).pow(2).mean(0).view(-1, 2).sum(1)
    torch.testing.assert_close(key_e[:3].log().mean(), before[:3].log().mean())  # overall size kept
    angles = torch.rand(dr // 2, generator=gen, dtype=torch.float64) * 6.28

    def scores(t):
        q = (x[:4] @ t["q_aug"].T).view(4, heads, dn + dr)[..., dn:]
        k = rotate_pairs(x[4:9] @ t["kv_a_aug"][r:].T, angles)
        return torch.einsum("ahd,bd->abh", rotate_pairs(q, angles * 0.3), k)

    torch.testing.assert_close(scores(out), scores(w), rtol=1e-10, atol=1e-10)

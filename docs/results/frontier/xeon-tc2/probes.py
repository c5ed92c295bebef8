"""Each layer side's measured sensitivity to its code (measured.py's probes; tried, not a convert candidate).

bit_alloc's energies put every direction of every layer in one unit (the attention-output error, a
first-order model). On the bundled model that unit misjudges whole sides: it calls layer 0's value
error cheap, and water-filling over all layers then gives layer 0's values no bits at all. Here each
side (a layer's latent, the V side with the keys' dropped dims; its rope key, the K side) is read
through a probe code alone — the uniform code at the budget, the rest of the cache exact — and the
KL of the next-token distributions from the source's is measured on the selection prompts' answers
(`kl`). Each side's energies are scaled by its measured KL over its modelled error at the probe, so
the water-filling over all layers moves bits where the measured loss per unit of modelled error is
largest (KL grows about linearly with a small cache error, so the probe calibrates the unit).
"""

from __future__ import annotations


from latentkv.convert import bit_alloc
from latentkv.convert import transform_code as tc
from latentkv.convert.simulated import simulate

ALLOCATIONS = (*bit_alloc.ALLOCATIONS, "measured")
PROBE_EXAMPLES = 8  # selection prompts each probe is scored on
SIDES = ("latent", "rope")


def side_kls(model, probe: tc.TransformCode, kl) -> list[tuple[float, float]]:
    """(latent KL, rope-key KL) per layer: kl() of `model` with only that side read through probe."""
    out = []
    for i in range(len(probe.latent_bits)):
        out.append(tuple(kl(simulate(model, probe, only=(i, side))) for side in SIDES))
    return out


def weighted(energies: list, probe: tc.TransformCode, kls: list[tuple[float, float]]) -> list:
    """energies with each side's scaled by its measured KL / modelled error at the probe (a side the
    probe leaves exact, or that the model calls error-free, keeps its energies)."""
    out = []
    for (lat, rope), lb, rb, kl_pair in zip(energies, probe.latent_bits, probe.rope_bits, kls):
        sides = []
        for energy, bits, kl in zip((lat, rope), (lb, rb), kl_pair):
            modelled = tc.expected_error(energy, list(bits))
            sides.append(energy * (max(kl, 0.0) / modelled) if modelled > 0 and kl > 0 else energy)
        out.append(tuple(sides))
    return out


def allocation(name: str, energies: list, kv_bytes: int, means=None, model=None, kl=None) -> tc.TransformCode:
    """The code `name` (one of ALLOCATIONS) gives within kv_bytes, centred on means ((latent [r],
    rope key [dr]) per layer; energies then the centred rows'); "measured" probes `model` (a
    converted MLAForCausalLM, left reading the last probe) with `kl` (model -> float)."""

    def centre(code: tc.TransformCode) -> tc.TransformCode:
        return code if means is None else code.centred([m[0] for m in means], [m[1] for m in means])

    if name != "measured":
        return centre(bit_alloc.allocation(name, energies, kv_bytes))
    probe = centre(bit_alloc.uniform([(len(lat), len(rope)) for lat, rope in energies], kv_bytes))
    return centre(bit_alloc.allocate(weighted(energies, probe, side_kls(model, probe, kl)), kv_bytes))


def answer_kl(chat_model, reference, cases) -> float:
    """Mean KL(reference ‖ model) of the next token over the cases' answer positions."""
    total = count = 0.0
    for case in cases:
        ref, mine = reference.answer_logprobs(case), chat_model.answer_logprobs(case)
        total += float((ref.exp() * (ref - mine)).sum())
        count += len(ref)
    return total / max(count, 1)

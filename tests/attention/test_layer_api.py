"""attention/layer_api.py: the `AttentionLayer` protocol names exactly what the attention package
calls on a layer (read from the source), every backend annotates its `layer` with it, and model/mla.py's
`MLAttention` has every member with the protocol's parameters."""

import ast
import inspect
from pathlib import Path

import torch

import latentkv.attention
from latentkv.attention.layer_api import AttentionLayer, GroupedRopeKeys
from latentkv.model.loader import load_model
from latentkv.model.mla import MLAttention
from latentkv.model.rope_groups import RopeGroups

PACKAGE = Path(latentkv.attention.__file__).parent


def members(protocol) -> dict[str, object]:
    """A protocol's own members: its annotated attributes (None) and its methods."""
    found = {name: None for name in protocol.__annotations__}
    found.update(
        {
            name: value
            for name, value in vars(protocol).items()
            if inspect.isfunction(value) and not name.startswith("_")
        }
    )
    return found


def layer_parameters(function: ast.FunctionDef) -> dict[str, ast.expr | None]:
    """A function's parameters that hold a layer: named `layer` or annotated AttentionLayer -> their annotation."""
    args = function.args.args + function.args.kwonlyargs
    return {
        a.arg: a.annotation
        for a in args
        if a.arg == "layer" or (isinstance(a.annotation, ast.Name) and a.annotation.id == "AttentionLayer")
    }


def called_on_layers(source: str) -> tuple[set[str], list[str]]:
    """(every attribute the source reads on a layer parameter, the layer parameters not annotated AttentionLayer)."""
    used, unannotated = set(), []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = layer_parameters(node)
        unannotated += [
            f"{node.name}({name})"
            for name, note in params.items()
            if not (isinstance(note, ast.Name) and note.id == "AttentionLayer")
        ]
        used |= {
            n.attr
            for n in ast.walk(node)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in params
        }
    return used, unannotated


def test_the_reader_finds_what_a_function_calls_on_its_layer():
    used, unannotated = called_on_layers(
        "def f(layer, x):\n    return layer.absorb(x) + layer.dn\ndef g(a: AttentionLayer):\n    return a.scale\n"
    )
    assert used == {"absorb", "dn", "scale"} and unannotated == ["f(layer)"]


def test_the_attention_package_calls_exactly_the_protocol_on_a_layer():
    used, unannotated = set(), []
    for path in sorted(PACKAGE.glob("*.py")):
        found, missing = called_on_layers(path.read_text())
        used |= found
        unannotated += [f"{path.name}: {m}" for m in missing]
    assert unannotated == []
    assert used == set(members(AttentionLayer))


@torch.inference_mode()
def test_mlattention_has_every_member_with_the_protocols_parameters(tiny_checkpoints):
    layer = load_model(tiny_checkpoints("v3_dense_qlora")[0]).model.layers[0].self_attn
    assert isinstance(layer, AttentionLayer)
    for name, method in members(AttentionLayer).items():
        assert hasattr(layer, name), name
        if method is not None:
            assert list(inspect.signature(getattr(MLAttention, name)).parameters) == list(
                inspect.signature(method).parameters
            ), name
    for name in ("n_heads", "kv_rank", "dn", "dr", "dv"):
        assert isinstance(getattr(layer, name), int), name
    assert isinstance(layer.scale, float)
    for name, method in members(GroupedRopeKeys).items():
        assert list(inspect.signature(getattr(RopeGroups, name)).parameters) == list(
            inspect.signature(method).parameters
        ), name


def test_a_layer_without_a_member_is_not_an_attention_layer():
    class Partial:
        n_heads = kv_rank = dn = dr = dv = 1
        scale = 1.0

        def absorb(self, q_nope, q_rope):
            return q_nope

    assert not isinstance(Partial(), AttentionLayer)

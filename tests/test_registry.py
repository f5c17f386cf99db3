"""The converter registry: duplicate registrations are refused, and an older converter serves
a newer schema version only across type-list-only steps (graph/registry.py's rule)."""

from __future__ import annotations

import onnx
import pytest

from ort_torch_compat.graph import converter_registry as registry


def test_duplicate_registration_is_refused(monkeypatch):
    monkeypatch.setitem(registry._OUR_CONVERTERS, ("", "RegistryTestOp"), {})

    def first(node, graph):
        raise AssertionError("not called")

    registry.register("RegistryTestOp", 3, 7)(first)
    with pytest.raises(registry.DuplicateConverterError, match=r"\(ai.onnx, RegistryTestOp, version 7\).*first"):
        registry.register("RegistryTestOp", 7)(lambda node, graph: None)
    registry.register("RegistryTestOp", 9)(first)  # another version is fine


@pytest.mark.parametrize(
    "op, version, expected",
    [
        ("Relu", 14, True),  # re-declared for types only
        ("Identity", 21, True),
        ("Add", 14, True),  # documentation notes the new types: editorial
        ("ReduceMean", 18, False),  # axes became an input
        ("Split", 18, False),  # num_outputs attribute
        ("Pad", 19, False),  # mode gained "wrap": an old converter would not know it
        ("ScatterND", 18, False),  # reduction gained max/min
        ("Max", 8, False),  # multidirectional broadcasting
        ("Softmax", 13, False),  # axis default and meaning changed
        ("Relu", 6, False),  # consumed_inputs removed
    ],
)
def test_type_list_only_steps(op, version, expected):
    assert registry.type_list_only(op, version) is expected


def test_fallback_follows_the_rule():
    assert registry._served_versions("Relu", 14) == [14, 13, 6]
    assert registry._served_versions("ReduceMean", 18) == [18]
    # Pad-21 is Pad-19 re-typed, so Pad-19's converter serves it; Pad-18's does not serve 19
    assert registry._served_versions("Pad", 21) == [21, 19]
    assert registry.find_converter("", "Pad", 21) is registry.find_converter("", "Pad", 19)


def _structure(schema):
    """Inputs, outputs and attributes without their descriptions."""
    signature = registry._signature(schema)
    return (tuple(p[:3] for p in signature[0]), tuple(p[:3] for p in signature[1]), tuple(a[:4] for a in signature[2]))


def test_editorial_steps_change_no_structure():
    """The reviewed list may only excuse documentation changes."""
    for (op, version), _reason in registry._EDITORIAL_STEPS.items():
        versions = sorted(registry._schemas()[op])
        previous = versions[versions.index(version) - 1]
        table = registry._schemas()[op]
        assert _structure(table[previous]) == _structure(table[version]), (op, version)
        assert registry._signature(table[previous]) != registry._signature(table[version]), (op, version, "not needed")


@pytest.mark.skipif(not onnx.__version__.startswith("1.23."), reason="the docstring's counts are onnx 1.23's")
def test_docstring_counts_are_measured():
    steps = pure = documentation = structural = 0
    for op, table in registry._schemas().items():
        versions = sorted(v for v in table if v <= 21)
        for older, newer in zip(versions, versions[1:]):
            steps += 1
            if registry._signature(table[older]) == registry._signature(table[newer]):
                pure += 1
            elif _structure(table[older]) == _structure(table[newer]):
                documentation += 1
            else:
                structural += 1
    assert (steps, pure, documentation, structural, len(registry._EDITORIAL_STEPS)) == (301, 92, 91, 118, 37)
    for count in ("301", "92", "91", "118", "37"):
        assert count in registry.__doc__

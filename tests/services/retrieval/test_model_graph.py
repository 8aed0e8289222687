"""The local model's graph with fused attention and GELU: the same vectors, fewer operators."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from services.retrieval import embeddings
from services.retrieval.embeddings import local_model_files, quantized_model
from services.retrieval.model_graph import GraphMismatch, fused

QUESTIONS = [
    "How do I rotate the API key?",
    "What does the proxy do when every backend connection in its pool is busy for longer "
    "than the configured timeout, and can that be changed per route?",
    "Qu'est-ce que la licence permet de redistribuer ?",
    "hi",
]


@pytest.fixture(scope="module")
def quantized() -> bytes:
    return quantized_model(local_model_files()[0])


def vectors(graph: bytes, texts: list[str], *, together: bool = False) -> np.ndarray:
    import onnxruntime

    model = embeddings._load_model(1)
    session = onnxruntime.InferenceSession(
        graph, embeddings.session_options(1), providers=["CPUExecutionProvider"]
    )
    loaded = embeddings._LoadedModel(session, model.tokenizer, model.needs_token_types)
    encodings = [model.tokenizer.encode(t) for t in texts]
    if together:  # one padded batch
        return np.array(embeddings._run(loaded, encodings))
    return np.array([embeddings._run(loaded, [e])[0] for e in encodings])


def test_each_layer_runs_one_attention_and_one_gelu(quantized: bytes) -> None:
    ops = collections.Counter(n.op_type for n in onnx.load_from_string(fused(quantized)).graph.node)
    assert ops["MultiHeadAttention"] == 6 and ops["BiasGelu"] == 6
    # What they replace is gone, the 8-bit products stay.
    assert not {"Softmax", "Erf", "Transpose", "IsNaN", "Where"} & set(ops)
    assert ops["MatMulInteger"] == 36 and "MatMul" not in ops


def test_fused_questions_get_the_same_vectors(quantized: bytes) -> None:
    before, after = vectors(quantized, QUESTIONS), vectors(fused(quantized), QUESTIONS)
    # Only the order of float32 operations changed (and so, rarely, an 8-bit rounding).
    assert np.einsum("ij,ij->i", before, after).min() > 0.999


def test_padding_is_masked_as_before(quantized: bytes) -> None:
    # Questions are embedded one at a time, but a padded batch must not let padding in: the
    # short questions' vectors would move (to a cosine of 0.6-0.85 with the mask left out).
    before = vectors(quantized, QUESTIONS, together=True)
    after = vectors(fused(quantized), QUESTIONS, together=True)
    assert np.einsum("ij,ij->i", before, after).min() > 0.999


def _edited(quantized: bytes, edit: Any) -> bytes:
    model = onnx.load_from_string(quantized)
    edit(model.graph)
    return model.SerializeToString()


def test_a_graph_of_another_shape_is_left_alone(quantized: bytes) -> None:
    def scaled_for_other_heads(graph: onnx.GraphProto) -> None:
        # 0.5 ** -4 = 16: a head size the scalings imply, but not the one Q, K, V are split by.
        scales = {
            n.input[1] for n in graph.node if n.op_type == "Mul" and "transpose" in n.input[0]
        }
        for i, init in enumerate(graph.initializer):
            if init.name in scales:
                graph.initializer[i].CopyFrom(
                    numpy_helper.from_array(np.array(0.5, dtype=np.float32), init.name)
                )

    def a_foreign_operator(graph: onnx.GraphProto) -> None:
        softmax = next(n for n in graph.node if n.op_type == "Softmax")
        relu = onnx.helper.make_node("Relu", [softmax.input[0]], ["relu_in_attention"])
        softmax.input[0] = "relu_in_attention"
        graph.node.insert(list(graph.node).index(softmax), relu)

    def no_gelu_bias(graph: onnx.GraphProto) -> None:
        erf = next(n for n in graph.node if n.op_type == "Erf")
        div = next(n for n in graph.node if erf.input[0] in n.output)
        add = next(n for n in graph.node if div.input[0] in n.output)
        add.op_type = "Sub"

    for edit, reason in (
        (scaled_for_other_heads, "heads not split 16 wide"),
        (a_foreign_operator, "Relu in the attention"),
        (no_gelu_bias, "not a bias addition"),
    ):
        with pytest.raises(GraphMismatch, match=reason):
            fused(_edited(quantized, edit))


def test_the_questions_copy_is_fused_or_else_left_unfused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from services.retrieval import model_graph

    model = embeddings._load_model()
    made: list[bytes] = []

    def recorded(graph: bytes) -> bytes:
        made.append(fused(graph))
        return made[-1]

    def mismatch(graph: bytes) -> bytes:
        raise GraphMismatch("layer 0: not one softmax between two products")

    text = [model.tokenizer.encode("How do I rotate the API key?")]
    with caplog.at_level("WARNING", logger="services.retrieval.embeddings"):
        monkeypatch.setattr(model_graph, "fused", recorded)
        copy = embeddings._build_query_model(model)
        assert len(made) == 1 and not caplog.text
        monkeypatch.setattr(model_graph, "fused", mismatch)
        plain = embeddings._build_query_model(model)
    assert "copy's attention stays unfused" in caplog.text and "not one softmax" in caplog.text
    # Unfused, it is still the 8-bit copy: the same vector, not the float32 model's.
    assert embeddings._run(plain, text)[0] == pytest.approx(
        embeddings._run(copy, text)[0], abs=2e-3
    )
    assert embeddings._run(plain, text)[0] != pytest.approx(
        embeddings._run(model, text)[0], abs=2e-3
    )


PASSAGES = [
    "The proxy keeps at most max_connections open to each backend; a request that finds all of "
    "them busy waits for pool_timeout seconds and then fails with 503.",
    "Licensed under the Apache License, Version 2.0.",
    "short",
]


def test_the_passages_model_is_fused_and_embeds_as_the_file_does(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import onnxruntime

    from services.retrieval import model_graph

    source = local_model_files()[0]
    plain = onnxruntime.InferenceSession(
        str(source), embeddings.session_options(1), providers=["CPUExecutionProvider"]
    )
    made: list[bytes] = []

    def recorded(graph: bytes) -> bytes:
        made.append(fused(graph))
        return made[-1]

    monkeypatch.setattr(embeddings, "_model", None)
    monkeypatch.setattr(model_graph, "fused", recorded)
    with caplog.at_level("WARNING", logger="services.retrieval.embeddings"):
        model = embeddings._load_model()
    assert len(made) == 1 and not caplog.text
    stored = embeddings._LoadedModel(plain, model.tokenizer, model.needs_token_types)
    encodings = [model.tokenizer.encode(t) for t in PASSAGES]
    # Stored vectors stay comparable: float32 all through, so only rounding differs. Padded
    # together, as passages are embedded.
    assert np.array(embeddings._run(model, encodings)) == pytest.approx(
        np.array(embeddings._run(stored, encodings)), abs=1e-6
    )

    def mismatch(graph: bytes) -> bytes:
        raise GraphMismatch("layer 0: Relu in the attention")

    monkeypatch.setattr(embeddings, "_model", None)
    monkeypatch.setattr(model_graph, "fused", mismatch)
    with caplog.at_level("WARNING", logger="services.retrieval.embeddings"):
        unfused = embeddings._load_model()
    assert "the local model's attention stays unfused" in caplog.text
    assert embeddings._run(unfused, encodings) == embeddings._run(stored, encodings)


def test_without_onnx_the_model_still_loads_unfused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import sys

    import services.retrieval

    monkeypatch.setattr(embeddings, "_model", None)
    # As if onnx were not installed: importing model_graph fails.
    monkeypatch.setitem(sys.modules, "services.retrieval.model_graph", None)
    monkeypatch.delattr(services.retrieval, "model_graph", raising=False)
    with caplog.at_level("WARNING", logger="services.retrieval.embeddings"):
        model = embeddings._load_model()
    assert "the local model's attention stays unfused" in caplog.text
    assert len(embeddings._run(model, [model.tokenizer.encode("still embeds")])[0]) == 384

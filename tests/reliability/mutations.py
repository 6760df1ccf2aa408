"""Seeded mutations of a SavedModel proto, the kinds of damage a fuzz test throws at the converter: flipped bytes,
removed inputs, invalid dtype enums, deleted functions, duplicate names. Each returns the mutated file's bytes."""

from __future__ import annotations

import random

from tensorflow.core.protobuf import saved_model_pb2

KINDS = ("flip_bytes", "remove_input", "invalid_dtype", "delete_function", "duplicate_name")
BAD_DTYPES = (999, 25, 100, -1, 1000000)  # 25 is unused by TF; 100+ ref types are out of range too


def _bodies(model: saved_model_pb2.SavedModel) -> list:
    """Every node list of the first MetaGraph: the main graph's nodes and each function body's."""
    graph = model.meta_graphs[0].graph_def
    return [graph.node] + [f.node_def for f in graph.library.function]


def _nodes(model) -> list:
    return [n for body in _bodies(model) for n in body]


def flip_bytes(data: bytes, rng: random.Random) -> bytes:
    """XOR one or two random bytes with a random non-zero byte."""
    data = bytearray(data)
    for _ in range(rng.randint(1, 2)):
        data[rng.randrange(len(data))] ^= rng.randint(1, 255)
    return bytes(data)


def remove_input(model, rng: random.Random) -> None:
    """Delete one input (data or control) of a random node that has inputs."""
    node = rng.choice([n for n in _nodes(model) if n.input])
    del node.input[rng.randrange(len(node.input))]


def invalid_dtype(model, rng: random.Random) -> None:
    """Set a type attr, a list(type) element or a signature's TensorInfo dtype to a value TF does not know."""
    bad = rng.choice(BAD_DTYPES)
    bad = bad if bad >= 0 else 2 ** 31 - 1
    targets = [(n, k) for n in _nodes(model) for k, v in n.attr.items() if v.WhichOneof("value") in ("type", "list")
               and (v.WhichOneof("value") == "type" or v.list.type)]
    infos = [i for sig in model.meta_graphs[0].signature_def.values() for i in list(sig.inputs.values())
             + list(sig.outputs.values())]
    if infos and (not targets or rng.random() < 0.2):
        rng.choice(infos).dtype = bad
        return
    node, key = rng.choice(targets)
    value = node.attr[key]
    if value.WhichOneof("value") == "type":
        value.type = bad
    else:
        value.list.type[rng.randrange(len(value.list.type))] = bad


def delete_function(model, rng: random.Random) -> None:
    """Remove one function from the library (a signature's, a nested one, or a save/restore function)."""
    library = model.meta_graphs[0].graph_def.library.function
    del library[rng.randrange(len(library))]


def duplicate_name(model, rng: random.Random) -> None:
    """Give a node the name of another node of the same body, or a function the name of another function."""
    library = model.meta_graphs[0].graph_def.library.function
    if len(library) > 1 and rng.random() < 0.3:
        a, b = rng.sample(range(len(library)), 2)
        library[a].signature.name = library[b].signature.name
        return
    body = rng.choice([b for b in _bodies(model) if len(b) > 1])
    a, b = rng.sample(range(len(body)), 2)
    body[a].name = body[b].name


def mutate(data: bytes, kind: str, seed: int) -> bytes:
    """Return saved_model.pb bytes with one mutation of `kind`, chosen by `seed`."""
    rng = random.Random(f"{kind}-{seed}")
    if kind == "flip_bytes":
        return flip_bytes(data, rng)
    model = saved_model_pb2.SavedModel.FromString(data)
    globals()[kind](model, rng)
    return model.SerializeToString(deterministic=True)

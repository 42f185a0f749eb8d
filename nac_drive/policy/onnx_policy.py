"""A driving policy exported by :mod:`.onnx_export`, run by onnxruntime: ``drive --policy OUT.onnx``.

    policy = OnnxPolicy("policy.onnx")      # one onnxruntime thread by default
    policy.reset()
    action = policy.select_action(obs)      # DrivingPolicy's closed-loop protocol (ClosedLoop)

The file alone suffices: its ``metadata_props`` hold the policy's config (task, window,
frame_dt, action mapping) and which graph it is. A ``"step"`` graph carries the NAC cache
from frame to frame, as :meth:`DrivingPolicy.select_action` does; a ``"window"`` graph is run
on the episode's last ``window`` frames and its last output read. Either gets the same
timestamps the torch policy gets (:meth:`ClosedLoop.episode_time`).

Loading never executes code: the model is read into memory (a regular file, capped at
:data:`MAX_BYTES`) and handed to onnxruntime as bytes, so it cannot name external data files;
no custom-operator library is registered. A file that is not such a policy (not ONNX,
truncated, another model's inputs, a head of another width than its config's, no nac-drive
metadata, NaN or inf weights, control flow or a tensor too large: :func:`check_model`) is
refused in one line.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from nac_drive.io import bounded_json
from nac_drive.io.capped_read import read_capped
from nac_drive.io.checkpoint import CheckpointError, check_values
from nac_drive.policy.driving_policy import ClosedLoop, PolicyConfig
from nac_drive.policy.encoders import ENCODERS

MAX_BYTES = 256 * 2**20   # far above any policy here (the shipped ones: ~1 MB)
MAX_ELEMENTS = 2**26      # values in one tensor of known size; an exported policy's largest holds 192,000
CONTROL_FLOW = frozenset({"Loop", "Scan", "If"})
# What an exported file holds (:mod:`.onnx_export` writes it): its graphs' inputs and outputs, and
# the metadata_props keys of its format, its graph and the policy's config JSON.
FORMAT = "nac-drive-onnx-1"
GRAPHS = ("step", "window")
INPUTS = {"step": ("frame", "t", "cache", "steps"), "window": ("frames", "t")}
OUTPUTS = {"step": ("output", "cache_out", "steps_out"), "window": ("outputs",)}
META_FORMAT, META_GRAPH, META_CONFIG = "nac_drive.format", "nac_drive.graph", "nac_drive.policy_config"
EXTRA_HINT = "pip install 'nac-drive[onnx]'"
SUFFIX = ".onnx"


def is_onnx_path(path) -> bool:
    """Whether ``path`` names an ONNX file (by its suffix, in any case: ``x.ONNX`` too)."""
    return str(path).lower().endswith(SUFFIX)


def session(path: str | Path, threads: int = 1):
    """An onnxruntime CPU session of the model at ``path``, on ``threads`` threads; a file
    onnxruntime cannot load is refused in one line (:class:`CheckpointError`)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise ValueError(f"an ONNX policy runs on onnxruntime (the 'onnx' extra): {EXTRA_HINT}") from None
    data = read_capped(path, MAX_BYTES)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3   # errors only: the refusal below says what went wrong
    try:
        loaded = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except Exception as e:   # onnxruntime's errors (InvalidProtobuf, Fail, ...) derive from Exception only
        why = " ".join(str(e).split())[:200]
        raise CheckpointError(f"{path}: not an ONNX model onnxruntime can load ({why})") from None
    check_model(data, path)   # after onnxruntime's load, which refuses external data
    return loaded


def check_model(data: bytes, path: str | Path) -> None:
    """What onnxruntime would only meet while driving, refused at load in one line: NaN or inf
    weights (:func:`check_weights`), control flow (a ``Loop`` of 10^12 iterations hangs the
    first frame; the exporter writes no ``Loop``, ``Scan`` or ``If``) and any tensor whose size
    shape inference knows above :data:`MAX_ELEMENTS` (a constant shape asking for 40 TB)."""
    try:
        import onnx
    except ImportError:
        raise ValueError(f"an ONNX policy is checked by onnx (the 'onnx' extra): {EXTRA_HINT}") from None
    model = onnx.load_model_from_string(data)
    check_weights(model, path)
    flow = sorted({node.op_type for node in _nodes(model.graph, onnx)} & CONTROL_FLOW)
    if flow:
        raise CheckpointError(f"{path}: its graph has {', '.join(flow)} (control flow, unbounded work); nac-drive "
                              "export writes none")
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as e:   # onnx's shape errors share no base class
        raise CheckpointError(f"{path}: its shapes do not check ({' '.join(str(e).split())[:200]})") from None
    graph = inferred.graph
    for value in [*graph.input, *graph.value_info, *graph.output]:
        dims = value.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims) and math.prod(d.dim_value for d in dims) > MAX_ELEMENTS:
            raise CheckpointError(f"{path}: {value.name} would hold {math.prod(d.dim_value for d in dims):,} values, "
                                  f"more than {MAX_ELEMENTS:,}")


def check_weights(model, path: str | Path) -> None:
    """The model's constants (initializers and Constant nodes, subgraphs included) as
    :func:`~nac_drive.io.checkpoint.check_values` checks a checkpoint's weights: NaN or inf
    weights load, then drive with every output NaN. A scalar may be infinite: the exporter's
    own fills (``-inf`` for a masked logit, float32's lowest for a clamp) are scalars."""
    import onnx
    from onnx import numpy_helper

    weights, scalars = {}, {}
    for name, tensor in _constants(model.graph, onnx):
        array = numpy_helper.to_array(tensor)
        if array.dtype.kind == "f":
            (weights if array.ndim else scalars)[name] = torch.from_numpy(np.array(array, np.float32))
    check_values(weights, path)
    for name, value in scalars.items():
        if value.isnan():
            raise CheckpointError(f"{path}: {name} contains NaN or inf")


def _nodes(graph, onnx):
    """Every node of ``graph`` and of its subgraphs."""
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else []) + list(attribute.graphs):
                yield from _nodes(sub, onnx)


def _constants(graph, onnx):
    """(name, TensorProto) of every constant of ``graph`` and of its subgraphs."""
    yield from ((t.name, t) for t in graph.initializer)
    yield from ((t.values.name, t.values) for t in graph.sparse_initializer)
    for node in _nodes(graph, onnx):
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                yield f"{node.name or node.op_type}.{attribute.name}", attribute.t
            yield from ((f"{node.name or node.op_type}.{attribute.name}", t) for t in attribute.tensors)


class OnnxPolicy(ClosedLoop):
    """A policy of ``nac-drive export --format onnx`` on onnxruntime, with
    :class:`~nac_drive.policy.driving_policy.DrivingPolicy`'s ``reset`` / ``select_action`` /
    ``act`` / ``predict`` / ``check_env`` (:class:`ClosedLoop`). ``config`` is the exported
    policy's :class:`PolicyConfig`; ``graph`` ``"step"`` or ``"window"``."""

    def __init__(self, path: str | Path, threads: int = 1):
        self.path = Path(path)
        self.session = session(path, threads)
        self.graph, self.config = _read_metadata(self.session.get_modelmeta().custom_metadata_map, self.path)
        self.frame_shape: tuple[int, int, int] = ENCODERS[self.config.encoder].frame_shape
        self._check_signature()
        self.reset()

    def _check_signature(self) -> None:
        """The graph's inputs and outputs are the ones :mod:`.onnx_export` writes for this
        config: a head of another width than the config's would return actions outside its
        action space, or fail mid-drive."""
        window, core, width = self.config.core.window, self.config.core, self.config.num_outputs
        if self.graph == "step":
            cache = [1, core.num_heads, window, None]   # cache_width: the layer's own
            inputs = {"frame": ([1, *self.frame_shape], "uint8"), "t": ([1], "float"),
                      "cache": (cache, "float"), "steps": ([], "int64")}
            outputs = {"output": ([1, width], "float"), "cache_out": (cache, "float"), "steps_out": ([], "int64")}
        else:
            inputs = {"frames": ([1, None, *self.frame_shape], "uint8"), "t": ([1, None], "float")}
            outputs = {"outputs": ([1, None, width], "float")}
        for side, expected, names, nodes in (("inputs", inputs, INPUTS, self.session.get_inputs()),
                                              ("outputs", outputs, OUTPUTS, self.session.get_outputs())):
            found = {i.name: (i.shape, i.type) for i in nodes}
            ok = list(found) == list(names[self.graph]) and all(
                found[name][1] == f"tensor({kind})" and len(found[name][0]) == len(shape)
                and all(want is None or got == want for got, want in zip(found[name][0], shape))
                for name, (shape, kind) in expected.items())
            if not ok:
                seen = ", ".join(f"{n} {s} {k}" for n, (s, k) in found.items())
                raise CheckpointError(f"{self.path}: its {side} ({seen}) are not those of a {self.graph} graph of "
                                      f"this policy's config ({width} outputs); export it again with nac-drive export")
            if side == "inputs" and self.graph == "step":
                self._cache_shape = tuple(found["cache"][0])

    def step_output(self, obs) -> torch.Tensor:
        """Consume one observation; returns the head's raw output ``[num_outputs]``."""
        frame, timestamp = self.observation_to_frame(obs)
        t = self.episode_time(timestamp).numpy()
        frame = np.ascontiguousarray(frame.numpy())[None]                           # [1, C, H, W]
        if self.graph == "step":
            cache, steps = self._state or (np.zeros(self._cache_shape, np.float32), np.array(0, np.int64))
            output, cache, steps = self.session.run(None, {"frame": frame, "t": t, "cache": cache, "steps": steps})
            self._state, output = (cache, steps), output[0]
        else:   # the last `window` frames, as the torch policy's window holds them
            window = self.config.core.window
            frames, times = self._state or (np.empty((1, 0, *self.frame_shape), np.uint8), np.empty((1, 0), np.float32))
            frames = np.concatenate([frames, frame[:, None]], axis=1)[:, -window:]
            times = np.concatenate([times, t[None]], axis=1)[:, -window:]
            self._state = (frames, times)
            output = self.session.run(None, {"frames": frames, "t": times})[0][0, -1]
        self._frames_seen += 1
        self.last_output = torch.from_numpy(np.array(output, np.float32))
        return self.last_output


def _read_metadata(meta: dict[str, str], path: Path) -> tuple[str, PolicyConfig]:
    """(graph, config) from an exported file's ``metadata_props``, each checked."""
    if meta.get(META_FORMAT) != FORMAT:
        raise CheckpointError(f"{path}: not a policy exported by nac-drive export (metadata {META_FORMAT} is "
                              f"{meta.get(META_FORMAT)!r}, expected {FORMAT!r})")
    graph = meta.get(META_GRAPH)
    if graph not in GRAPHS:
        raise CheckpointError(f"{path}: metadata {META_GRAPH} must be one of {GRAPHS}, got {graph!r}")
    try:
        config = PolicyConfig.from_dict(bounded_json.loads(meta.get(META_CONFIG, "")))
    except (TypeError, ValueError) as e:   # json.JSONDecodeError is a ValueError
        raise CheckpointError(f"{path}: metadata {META_CONFIG}: {' '.join(str(e).split())}") from None
    return graph, config

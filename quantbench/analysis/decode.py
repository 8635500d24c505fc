"""Output tensors -> the decisions a product serves, as the model's sidecar says.

Seven built-in decoders, none, or a plug-in, all on one fixture (batch of one) at a time:

``detr-sigmoid``       per query: argmax over the named class columns, sigmoid
                       score, kept when score >= threshold and the query is in
                       the top-k by score; no NMS. Slot = query index, so two
                       runs of the same graph compare query by query, exactly.
``classifier-softmax`` top-1 of the softmax; kept when the top-1 probability is
                       >= the threshold (always kept without one). One slot.
``threshold-map``      element-wise ``p >= threshold`` on a probability map
                       (segmentation, text detection); slots are the connected
                       regions (4-connectivity) of the mask.
``nms-boxes``          detections already NMS'd by the model (boxes, scores,
                       labels); kept at the threshold; compared by matching
                       (same class, IoU >= 0.5).
``yolo``               a raw Ultralytics head, one output ``[1, 4+C, N]``
                       (YOLOv8/v11) or ``[1, N, 4+C]``, or with objectness
                       ``[1, N, 5+C]`` (YOLOv5: score = obj * class prob); boxes
                       cx,cy,w,h in input pixels. Decoded with class-aware greedy
                       NMS and compared by matching, like ``nms-boxes``.
``yolox``              a raw anchor-free grid head, one output ``[1, N, 5+C]``
                       (YOLOX exported without decode_in_inference): per row
                       tx, ty, tw, th, objectness, C class scores over the
                       grids of strides 8/16/32; decoded as below, class-aware
                       NMS as ``yolo``, compared by matching.
``ctc``                greedy CTC of a text recogniser (CRNN, PaddleOCR rec):
                       one output ``[T, N, C]`` or ``[N, T, C]`` (batch one);
                       per time step the argmax, repeats collapsed, blanks
                       dropped. One slot whose decision is the decoded string.
``none``               no decisions: ``equiv`` still gives classes, distances and
                       the tensor gate. A sidecar without a decode block means none.
``module:function``    a decode plug-in (below).

``yolo`` keys of the sidecar decode block (defaults): ``output`` ("output0"; a
single-output model uses its output whatever the name), ``threshold`` (0.25),
``pre_threshold`` (threshold * 0.5), ``iou`` (0.45), ``max_det`` (300),
``layout`` ("channels-first" = [4+C, N] or "channels-last" = [N, 4+C]; default:
the one axis whose size is 4+C or 5+C for the sidecar's C classes, else the
smaller axis; equal axes need the key), ``objectness`` (default: true when the
channels are 5+C for the C named classes, else false), ``box_format``
("cxcywh"; "xyxy" for heads that emit corners). Per anchor: class = argmax, score = max class prob (times
objectness). *Candidates* are anchors with score >= pre_threshold; greedy NMS
runs on them per class (score descending, ties by anchor index, float64,
suppressing IoU > iou), and the first max_det survivors are the decisions.
``kept`` = score >= threshold, ``margin`` = score - threshold, slot = anchor
index. Because NMS is greedy by score, the kept survivors are exactly what NMS at
the threshold serves (a box can only be suppressed by a higher, hence also kept,
score), so a *threshold flip* means served on one side only; the extra
candidates between pre_threshold and threshold let a detection that dropped just
under the threshold match its fp32 twin and report a real fp32 margin.

``yolox`` keys: those of ``yolo`` but ``objectness`` (always on), plus ``strides``
([8, 16, 32]) and ``input_size`` ([height, width] of the model input; default: the
sidecar's input shape when static, else the square size whose grids give N rows,
e.g. 416 -> 52*52 + 26*26 + 13*13 = 3549). Rows run stride by stride, each grid row
by row (x fastest), as YOLOX's demo_postprocess builds them. Per row: cx = (tx +
grid_x) * stride, cy = (ty + grid_y) * stride, w = exp(tw) * stride, h = exp(th) *
stride (input pixels), class = argmax of the class scores, score = objectness * class
score (both as exported, already sigmoid); candidates, NMS, ``kept`` and ``margin``
as ``yolo``; slot = row index.

``ctc`` keys: ``output`` (the only output when there is one), ``blank`` (0, as
PaddleOCR and CRNN exports use), ``alphabet`` (the characters of the non-blank
classes in class order: a list, or the name of a text file beside the sidecar in
the model's folder, one character per line as PaddleOCR's dicts; the sidecar
reader inlines the file, so the recipe carries it), ``space`` (true or a one-character
string: appended to the alphabet, PaddleOCR's use_space_char), ``layout`` ("TNC" or
"NTC"; default: the one the run's actual output shape allows, [T, 1, C] or
[1, T, C]; a declared shape is never read). C must be 1 + len(alphabet). Without
an alphabet the string is the class ids joined by spaces. ``score`` = the mean
top-1 probability over the time steps, ``margin`` = the smallest top-1 minus top-2
gap of any step (how near the string is to changing), both of the softmax of each
step (of the values as they are when each step already sums to 1); ``kept`` is
always true. Two runs differ when their strings differ (a *text* flip).

A decode plug-in is ``--decode module:function`` or ``"kind": "module:function"``
in the sidecar decode block (``module`` an importable dotted module or a path to
a ``.py`` file, relative to the current folder; see quantbench.inputs.plugins)::

    def my_decode(outputs: dict[str, np.ndarray], spec: DecodeSpec) -> dict

``outputs`` holds every model output of one fixture (batch of one); ``spec``
carries ``threshold`` (sidecar or --threshold, default None), ``classes`` and
``params`` (the whole sidecar decode block, for the plug-in's own keys). A plug-in
that declares a ``geometry`` parameter (``def my_decode(outputs, spec, geometry=None)``)
also gets where the fixture's image went in the input (a letterbox's scale and pad,
the original size: quantbench.inputs.preprocess.Geometry.as_dict, None when unknown);
one without it is called as before. It
returns 1-D arrays of equal length: ``cls`` (int), ``score`` (finite float),
``kept`` (bool), and optionally ``box`` ([n, 4] xyxy: compared by matching,
like ``nms-boxes``; without it, compared slot by slot), ``slot`` (unique int
ids, default 0..n-1) and ``margin`` (default score - threshold, else NaN).

Each kind is one object (``DecoderKind``, found by ``kind_of(name)``, the built-ins in
``_BUILTIN``) carrying its whole policy: its decoder and sidecar keys, default outputs and
threshold, whether its scores are probabilities, how two runs' decisions compare
(quantbench.analysis.decisions), which accuracy plan scores it and the frame of its boxes
(quantbench.analysis.accuracy), and how the report words its margins. Other modules ask the
kind; none compares kind names.

Scores are computed in float64 from the raw outputs, so the decoder adds no
rounding of its own. ``Decoded.margin`` is the signed distance to the decision
boundary: score - threshold, or (classifier without a threshold) the gap between
the top-1 and top-2 probabilities.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from quantbench.inputs import plugins
from quantbench.errors import ParameterError, UserError, flag_mark
from quantbench.fsutil import canonical_json, sha256_bytes
from quantbench.inputs.modelio import load_model
from quantbench.inputs.sidecarfile import sidecar_for

NONE = "none"
IOU_MATCH = 0.5   # nms-boxes / regions: a detection matches when IoU >= this
IOU_SHIFT = 0.9   # a matched (or same-query) box with IoU below this is a box shift
YOLO_IOU = 0.45             # NMS suppresses a same-class box with IoU > this
YOLO_MAX_DET = 300
YOLO_PRE_RATIO = 0.5        # default pre_threshold = threshold * this
YOLO_LAYOUTS = ("channels-first", "channels-last")
YOLOX_STRIDES = (8, 16, 32)
CTC_LAYOUTS = ("TNC", "NTC")
FLIP_KINDS = ("threshold", "class", "box-shift")   # the flips of decisions with a class, a score and maybe a box
TEXT_FLIPS = ("text",)                             # the flips of decisions that are strings
BOX_FRAMES = ("normalized", "input-pixels")        # the frames a decoder's boxes can be in
NONE_HINT = f"pass {flag_mark('decode')} none to get the equivalence classes without decisions"


#: the decode block keys of every built-in kind
COMMON_KEYS = ("kind", "threshold", "top_k", "box_format", "box_frame")


@dataclass(frozen=True)
class DecoderKind:
    """One decode kind and its whole policy: how it decodes, how two runs' decisions compare, how they are
    scored against labels, and its sidecar defaults. Everything that differs between kinds is asked of the
    kind object (``kind_of``), never decided by comparing kind names elsewhere.

    ``compare`` names the comparison quantbench.analysis.decisions makes (aligned: slot by slot; matched: by
    box matching; map: by region matching; text: string against string; plugin: by boxes when returned, else
    by slot id); ``metric`` the plan quantbench.analysis.accuracy scores with (top-1, AP, text; None: not
    scored, ``unscored`` says why).
    """

    name: str
    decoder: Callable | None = None     # (spec, outputs) -> Decoded; None: no decisions
    outputs: Mapping = field(default_factory=dict)   # role -> default output name
    threshold: float | None = None      # the default threshold (also when the sidecar gives null)
    probability: bool = False           # scores are probabilities: a threshold outside [0, 1] is refused
    nms: bool = False                   # a raw head: candidates + class-aware NMS (the yolo keys)
    one_output: bool = False            # uses the model's only output whatever the sidecar names
    box_format: str = "xyxy"            # the default 'box_format'
    compare: str = "aligned"
    flips: tuple = FLIP_KINDS           # the flip kinds its comparisons count
    metric: str | None = None
    box_frame: str | None = None        # the frame of its boxes, when the sidecar's 'box_frame' does not say
    unscored: str = ""
    plugin: bool = False                # user code (module:function), loaded only with consent (quantbench.inputs.plugins)
    greedy: bool = False                # serves without a threshold by a greedy rule (ctc)
    no_threshold_margin: str = "fp32 score minus threshold"   # what a margin is when there is no threshold
    threshold_margin: str = "fp32 score minus threshold"      # what it is with one
    band_subject: str = "every flip against fp32"             # the flips the summary's band of scores holds
    band_words: str = "an fp32 score"                         # what that band ranges over
    margin_flips: tuple | None = None   # the flip kinds whose margins make the band (None: every kind)
    one_decision: bool = False          # one decision per image (a classifier's top-1, a recogniser's string)
    class_agnostic: bool = False        # scored against every labelled box whatever its category (a map's regions)
    own_keys: tuple = ()                # the decode block keys of its own (beyond COMMON_KEYS and its output roles)
    takes_geometry: bool = False        # its decoder is given each fixture's preprocess.Geometry (a plug-in's argument)

    @property
    def decides(self) -> bool:
        """It serves decisions (``none`` does not)."""
        return self.decoder is not None

    def keys(self, block: dict, sidecar: dict | None, where: str) -> dict:
        """The kind's own DecodeSpec fields from its sidecar decode block, checked."""
        return {}

    def block_keys(self) -> tuple:
        """Every key its sidecar decode block may hold: a key outside them is a typo, never ignored."""
        return (*COMMON_KEYS, *self.outputs, *self.own_keys)

    def describe(self, spec: DecodeSpec) -> dict:
        """The kind's own fields of ``DecodeSpec.as_dict``."""
        return {}

    def frame(self, block: dict) -> str | None:
        """The frame of its boxes: the decode block's 'box_frame', else the kind's."""
        return block.get("box_frame") or self.box_frame

    def ap_frame(self, block: dict, boxed: bool) -> tuple[str | None, str]:
        """(frame, "") for scoring its boxes, or (None, why not)."""
        frame = self.frame(block)
        if frame not in BOX_FRAMES:
            return None, (f"the frame of {self.name} boxes is unknown: set 'box_frame' to normalized or "
                          "input-pixels in the sidecar decode block")
        return frame, ""

    def margin_axis(self, threshold: float | None) -> str:
        """What a flip's fp32 margin measures."""
        return self.no_threshold_margin if threshold is None else self.threshold_margin

    def totals_fixed(self, threshold: float | None) -> bool:
        """Whether every image serves exactly one kept decision whatever the outputs (a recogniser's string, a
        classifier's top-1 without a threshold): equal totals are then by construction and conceal nothing."""
        return self.one_decision and (self.greedy or threshold is None)

    def rule(self, threshold: float | None) -> str:
        """How it serves, in a word: greedy, top-1 or the threshold."""
        return "greedy" if self.greedy else "top-1" if threshold is None else f"threshold {threshold:g}"


@dataclass(frozen=True)
class NmsKind(DecoderKind):
    """A raw detection head (yolo, yolox): candidates, class-aware NMS, compared by matching, scored by AP."""

    nms: bool = True
    one_output: bool = True
    own_keys: tuple = ("iou", "max_det", "pre_threshold", "layout", "objectness")
    box_format: str = "cxcywh"
    compare: str = "matched"
    metric: str | None = "AP"
    box_frame: str | None = "input-pixels"

    def keys(self, block, sidecar, where):
        return _yolo_keys(block, where)

    def describe(self, spec):
        return {"iou": spec.iou, "max_det": spec.max_det, "pre_threshold": spec.candidate_threshold,
                "layout": spec.layout, "objectness": spec.objectness}


@dataclass(frozen=True)
class YoloxKind(NmsKind):
    own_keys: tuple = ("iou", "max_det", "pre_threshold", "layout", "objectness", "strides", "input_size")

    def keys(self, block, sidecar, where):
        return _yolox_keys(block, sidecar, where)

    def describe(self, spec):
        return {**super().describe(spec), "strides": list(spec.strides),
                "input_size": None if spec.input_size is None else list(spec.input_size)}


@dataclass(frozen=True)
class CtcKind(DecoderKind):
    """A text recogniser: one decision, a string; text flips; exact match and CER."""

    one_output: bool = True
    own_keys: tuple = ("blank", "alphabet", "alphabet_file", "space", "layout")
    compare: str = "text"
    flips: tuple = TEXT_FLIPS
    metric: str | None = "text"
    greedy: bool = True
    one_decision: bool = True
    no_threshold_margin: str = "fp32 smallest per-step top-1 minus top-2 probability"

    def keys(self, block, sidecar, where):
        return _ctc_keys(block, where)

    def describe(self, spec):
        # the alphabet by content (a recogniser's runs to thousands of characters; the recipe holds them)
        return {"blank": spec.blank, "layout": spec.layout, "alphabet": None if spec.alphabet is None else {
            "characters": len(spec.alphabet), "sha256": sha256_bytes(canonical_json(list(spec.alphabet)).encode())}}


@dataclass(frozen=True)
class PluginKind(DecoderKind):
    """A decode plug-in (module:function): its boxes, when it returns them, in the frame its block names."""

    compare: str = "plugin"
    metric: str | None = "AP"
    plugin: bool = True
    takes_geometry: bool = True
    no_threshold_margin: str = "fp32 margin as the plug-in returns it"

    def describe(self, spec):
        return {"plugin": plugins.plugin_identity(self.name, flag_mark("decode"))}

    def ap_frame(self, block, boxed):
        if not boxed:
            return None, "a decode plug-in returning no boxes: no rule scores its decisions against the labels"
        if not block.get("box_frame"):
            return None, ("a decode plug-in: say its boxes' frame with 'box_frame' (normalized or input-pixels) "
                          "in the decode block")
        return super().ap_frame(block, boxed)


@dataclass(frozen=True)
class NoneKind(DecoderKind):
    """No decisions: equiv still gives classes, distances and the tensor gate."""

    unscored: str = "decode none: no decisions to score"

    def describe(self, spec):
        return {"note": spec.note}


def kind_of(name: str) -> DecoderKind:
    """The kind object of a decode kind name: a built-in, none, or a plug-in (module:function)."""
    if name in _BUILTIN:
        return _BUILTIN[name]
    if name == NONE:
        return NONE_KIND
    if plugins.is_ref(name):
        return PluginKind(name, decoder=decode_plugin)
    raise ValueError(f"unknown decode kind {name!r}")


def is_plugin(kind) -> bool:
    """A decode kind naming user code (module:function) rather than a built-in decoder."""
    return kind not in KINDS and kind != NONE and plugins.is_ref(kind)


def decode_arg(text: str) -> str:
    """argparse type of --decode: a built-in kind, none, or a plug-in that loads (so a typo fails before any run)."""
    import argparse

    if text in KINDS or text == NONE:
        return text
    if not plugins.is_ref(text):
        raise argparse.ArgumentTypeError(f"unknown decode kind {text!r}; choose one of {', '.join(KINDS)}, "
                                         f"{NONE}, or a plug-in module:function (or path/to/file.py:function)")
    try:
        plugins.check_ref(text, "decode plug-in")   # found, not run: running waits for consent (plugins.require)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


@dataclass
class DecodeSpec:
    kind: str
    outputs: dict                   # role -> output name
    threshold: float | None = None
    top_k: int | None = None
    classes: list = field(default_factory=list)
    box_format: str = "cxcywh"      # detr boxes; nms-boxes default xyxy
    iou: float | None = None        # yolo: NMS IoU
    max_det: int | None = None      # yolo: NMS survivors kept at most
    pre_threshold: float | None = None  # yolo: candidate score (None: threshold * YOLO_PRE_RATIO)
    layout: str | None = None       # yolo: channels-first | channels-last | None (auto)
    objectness: bool | None = None  # yolo: a 5th channel multiplies the class prob (None: auto)
    strides: tuple = YOLOX_STRIDES  # yolox: grid strides, in row order
    input_size: tuple | None = None  # yolox: (height, width) of the model input (None: from the row count)
    blank: int = 0                  # ctc: the blank class
    alphabet: tuple | None = None   # ctc: characters of the non-blank classes in class order (None: class ids)
    params: dict = field(default_factory=dict)   # plug-ins: the sidecar decode block
    note: str = ""                  # none: why there are no decisions

    def as_dict(self) -> dict:
        out = {"kind": self.kind, "outputs": dict(sorted(self.outputs.items())), "threshold": self.threshold,
               "top_k": self.top_k, "classes": list(self.classes), "box_format": self.box_format}
        return {**out, **self.decoder_kind.describe(self)}

    @property
    def decoder_kind(self) -> DecoderKind:
        """The kind object: what this decoder does, compares and scores."""
        return kind_of(self.kind)

    @property
    def candidate_threshold(self) -> float | None:
        """yolo: the score a box needs to enter NMS."""
        if self.pre_threshold is not None:
            return self.pre_threshold
        return None if self.threshold is None else self.threshold * YOLO_PRE_RATIO

    def class_name(self, c: int) -> str:
        """The sidecar's name of class `c`; a plug-in's class index as it is (its classes are its own)."""
        if 0 <= c < len(self.classes) and not is_plugin(self.kind):
            return str(self.classes[c])
        return "" if c < 0 else str(c)


def _yolo_keys(block: dict, where: str) -> dict:
    """The yolo keys of a decode block, checked (one-line errors naming the key)."""
    iou_v = block.get("iou", YOLO_IOU)
    max_det = block.get("max_det", YOLO_MAX_DET)
    pre = block.get("pre_threshold")
    layout = block.get("layout")
    obj = block.get("objectness")
    if not isinstance(iou_v, (int, float)) or not 0 < iou_v <= 1:
        raise UserError(f"{where}: decode 'iou' {iou_v!r} must be a number in (0, 1]")
    if isinstance(max_det, bool) or not isinstance(max_det, int) or max_det < 1:
        raise UserError(f"{where}: decode 'max_det' {max_det!r} must be a whole number >= 1")
    if pre is not None and (isinstance(pre, bool) or not isinstance(pre, (int, float))):
        raise UserError(f"{where}: decode 'pre_threshold' {pre!r} must be a number")
    if layout in (None, "auto"):
        layout = None
    elif layout not in YOLO_LAYOUTS:
        raise UserError(f"{where}: decode 'layout' {layout!r}: use {' or '.join(YOLO_LAYOUTS)} (or leave it out)")
    if obj is not None and not isinstance(obj, bool):
        raise UserError(f"{where}: decode 'objectness' {obj!r} must be true or false")
    return {"iou": float(iou_v), "max_det": int(max_det), "pre_threshold": None if pre is None else float(pre),
            "layout": layout, "objectness": obj}


def _yolox_keys(block: dict, sidecar: dict | None, where: str) -> dict:
    """The yolox keys (the yolo ones, objectness on, strides, input_size), checked."""
    extra = _yolo_keys(block, where)
    if extra["objectness"] is False:
        raise UserError(f"{where}: decode 'objectness' false: a yolox head always has an objectness column")
    extra["objectness"] = True
    strides = block.get("strides", list(YOLOX_STRIDES))
    if not (isinstance(strides, list) and strides and all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                                          for x in strides)):
        raise UserError(f"{where}: decode 'strides' {strides!r} must be a list of whole numbers > 0, e.g. [8, 16, 32]")
    size = block.get("input_size")
    if size is None:
        inp = (sidecar or {}).get("input") or {}
        shape = inp.get("shape")
        if isinstance(shape, list) and len(shape) == 4 and all(isinstance(x, int) and x > 0 for x in shape):
            size = shape[1:3] if inp.get("layout") == "NHWC" else shape[2:4]
    elif not (isinstance(size, list) and len(size) == 2
              and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in size)):
        raise UserError(f"{where}: decode 'input_size' {size!r} must be [height, width] in pixels")
    return {**extra, "strides": tuple(strides), "input_size": None if size is None else tuple(size)}


def _ctc_keys(block: dict, where: str) -> dict:
    """The ctc keys (blank, alphabet + space, layout), checked; an alphabet file must have been inlined."""
    blank = block.get("blank", 0)
    if isinstance(blank, bool) or not isinstance(blank, int) or blank < 0:
        raise UserError(f"{where}: decode 'blank' {blank!r} must be a class index >= 0")
    alphabet = block.get("alphabet")
    if isinstance(alphabet, str):
        raise UserError(f"{where}: decode 'alphabet' {alphabet!r} names a file, which is read beside a sidecar "
                        f"file; give the sidecar as a file (beside the model or {flag_mark('sidecar')} FILE), or list the characters")
    if alphabet is not None and not (isinstance(alphabet, list) and all(isinstance(c, str) and c for c in alphabet)):
        raise UserError(f"{where}: decode 'alphabet' must be a list of non-empty strings (one per class) or a file name")
    space = block.get("space", False)
    if space is True:
        space = " "
    if space not in (False, None) and not (isinstance(space, str) and len(space) == 1):
        raise UserError(f"{where}: decode 'space' {space!r} must be true, false or one character")
    if space:
        if alphabet is None:
            raise UserError(f"{where}: decode 'space' needs an 'alphabet' to append the space to")
        alphabet = [*alphabet, space]
    layout = block.get("layout")
    if layout not in (None, *CTC_LAYOUTS):
        raise UserError(f"{where}: decode 'layout' {layout!r}: use TNC or NTC (or leave it out)")
    return {"blank": blank, "alphabet": None if alphabet is None else tuple(alphabet), "layout": layout}


def replaced_block_note(sidecar: dict | None, kind: str | None) -> str | None:
    """When the caller's decoder `kind` is not the one the sidecar's decode block is for: a note saying so (the
    caller's wins, and the block's settings are not used: spec_from_sidecar); else None."""
    side = ((sidecar or {}).get("decode") or {}).get("kind")
    if kind is None or not side or side == kind or plugins.same_ref(side, kind):
        return None
    return f"decoder {kind} differs from the one the variants' decode block is for ({side}): that block's settings are not used"


def spec_from_sidecar(sidecar: dict | None, kind: str | None = None, threshold: float | None = None,
                      source: str = "sidecar") -> DecodeSpec:
    """The decode spec: the sidecar's "decode" block, overridden by `kind` / `threshold` (the caller's).

    No kind at all (no --decode, no decode block) is kind ``none``: a model
    without a decoder still has equivalence classes.
    """
    block = dict((sidecar or {}).get("decode") or {})
    side_kind = block.get("kind")
    given = kind is not None   # by the caller (the command line's --decode), not the sidecar
    kind = kind or side_kind
    classes = list((sidecar or {}).get("classes") or [])
    if not kind or kind == NONE:
        note = "" if kind == NONE else f"{source} has no decode block; pass --decode KIND to compare decisions"
        return DecodeSpec(kind=NONE, outputs={}, classes=classes, note=note)
    where = flag_mark("decode") if given else f"{source} decode 'kind'"
    if is_plugin(kind):
        plugins.load(kind, where, asked_by=None if given else f"{source}: decode 'kind'")  # fail (or refuse) now
        own = side_kind is None or plugins.same_ref(side_kind, kind)   # "./dec.py:fn" is the block of dec.py:fn
        thr = threshold if threshold is not None else (block.get("threshold") if own else None)
        return DecodeSpec(kind=kind, outputs={}, threshold=None if thr is None else float(thr), classes=classes,
                          params=block if own else {})
    if kind not in KINDS:
        raise UserError(f"{where} {kind}: unknown decode kind; choose one of {', '.join(KINDS)}, {NONE}, "
                        f"or a plug-in module:function")
    own = side_kind in (kind, None)
    k = kind_of(kind)
    if own:
        _check_block_keys(block, k, source)
    outputs = dict(k.outputs)
    if own:
        for role in outputs:
            if isinstance(block.get(role), str):
                outputs[role] = block[role]
    thr = threshold if threshold is not None else (block.get("threshold", k.threshold) if own else k.threshold)
    if thr is None:   # a kind with a default threshold always has one (a null in the sidecar means the default)
        thr = k.threshold
    if thr is not None and not (isinstance(thr, (int, float)) and not isinstance(thr, bool) and math.isfinite(thr)):
        problem = "must be a finite number (nan or inf would make every comparison false)"
        if threshold is not None:
            raise ParameterError("threshold", problem, thr)
        raise UserError(f"{source}: decode 'threshold' {thr!r}: {problem}")
    if thr is not None and k.probability and not 0 <= thr <= 1:
        problem = f"must be in [0, 1] ({kind} scores are probabilities; {thr:g} would keep or drop every decision)"
        if threshold is not None:
            raise ParameterError("threshold", problem, float(thr))
        raise UserError(f"{source}: decode 'threshold' {thr!r}: {problem}")
    top_k = block.get("top_k") if own else None
    box_format = block.get("box_format", k.box_format)
    extra = k.keys(block if own else {}, sidecar, source)
    spec = DecodeSpec(kind=kind, outputs=outputs, threshold=None if thr is None else float(thr),
                      top_k=None if top_k is None else int(top_k), classes=classes, box_format=box_format, **extra)
    if k.nms and spec.candidate_threshold > spec.threshold:
        raise UserError(f"{source}: decode 'pre_threshold' {spec.pre_threshold:g} is above the threshold "
                        f"{spec.threshold:g}; candidates must include every served box")
    return spec


def _check_block_keys(block: dict, k: DecoderKind, source: str) -> None:
    """A key the kind's decode block does not have (a typo: "thresold") is refused, naming the nearest one."""
    import difflib

    known = k.block_keys()
    for key in block:
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            raise UserError(f"{source}: decode {key!r}: not a key of a {k.name} decode block"
                            + (f"; did you mean {near[0]!r}?" if near else f" (keys: {', '.join(known)})"))


def check_outputs(spec: DecodeSpec, found, single_output_ok: bool = True) -> DecodeSpec:
    """Fail (naming expected and found outputs) when the model's outputs do not fit the decoder.

    A one-output decoder (classifier, threshold-map, yolo) on a single-output model uses
    that output when the sidecar names none (threshold-map and yolo: whatever it names);
    a plug-in receives every output.
    """
    found = list(found)
    k = spec.decoder_kind
    if not k.decides:
        return spec
    if k.plugin:
        return replace(spec, outputs={n: n for n in found})
    missing = [(r, n) for r, n in spec.outputs.items() if n not in found]
    unnamed = spec.outputs == dict(k.outputs)  # the sidecar named no output: the one there is
    if missing and len(spec.outputs) == 1 and single_output_ok and len(found) == 1 \
            and (unnamed or k.one_output):
        spec = replace(spec, outputs={next(iter(spec.outputs)): found[0]})
        missing = []
    if missing:
        expected = ", ".join(f"{r}={n!r}" for r, n in spec.outputs.items())
        raise ParameterError("decode", f"expects outputs {expected}; the model has "
                                       f"{', '.join(repr(f) for f in found) or 'none'}; pass another {flag_mark('decode')} or fix the sidecar 'decode' block", spec.kind)
    return spec


@dataclass
class Decoded:
    """The decisions of one run on one fixture; arrays are aligned by slot."""

    slot: np.ndarray                 # int64 slot id (query, detection or region index)
    cls: np.ndarray                  # int64 class id (-1: none)
    score: np.ndarray                # float64 score the threshold is applied to
    kept: np.ndarray                 # bool: served
    margin: np.ndarray               # float64 signed distance to the decision boundary
    box: np.ndarray | None = None    # (n, 4) xyxy, or None
    mask: np.ndarray | None = None   # threshold-map: the boolean mask
    labels: np.ndarray | None = None # threshold-map: region label per element (0 = background; slot = label - 1)
    prob: np.ndarray | None = None   # threshold-map: the map values, float64
    text: list | None = None         # ctc: the decoded string of each slot

    @property
    def total(self) -> int:
        return int(np.count_nonzero(self.kept))

    def digest(self) -> str:
        """The decisions' content, hashed (every array's dtype, shape and bytes): what a figure or a
        picture made from them is keyed by, so an unchanged decision is never scored or drawn again."""
        import hashlib

        h = hashlib.sha256()
        for name in ("slot", "cls", "score", "kept", "margin", "box", "mask", "labels", "prob"):
            a = getattr(self, name)
            if a is None:
                h.update(f"{name}:none;".encode())
                continue
            a = np.ascontiguousarray(a)
            h.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
            h.update(a.tobytes())
        if self.text is not None:   # only then: the digests of decoders without text stay as they were
            h.update(("text:" + "\x00".join(self.text) + f";{len(self.text)}").encode())
        return h.hexdigest()


def _squeeze_batch(a: np.ndarray, ndim: int, name: str, kind: str) -> np.ndarray:
    a = np.asarray(a)
    while a.ndim > ndim and a.shape[0] == 1:
        a = a[0]
    if a.ndim != ndim:
        raise ParameterError("decode", f"output {name!r} has shape {list(np.shape(a))}; expected {ndim} dims "
                                       f"after dropping a batch of one", kind)
    return a


def _sigmoid(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    ex = np.exp(x[~pos])
    out[~pos] = ex / (1.0 + ex)
    return out


def cxcywh_to_xyxy(b: np.ndarray) -> np.ndarray:
    b = np.asarray(b, dtype=np.float64)
    cx, cy, w, h = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of xyxy boxes, element-wise over the leading dims (broadcasting); equal empty boxes -> 1."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    x1 = np.maximum(a[..., 0], b[..., 0])
    y1 = np.maximum(a[..., 1], b[..., 1])
    x2 = np.minimum(a[..., 2], b[..., 2])
    y2 = np.minimum(a[..., 3], b[..., 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area_a = np.clip(a[..., 2] - a[..., 0], 0, None) * np.clip(a[..., 3] - a[..., 1], 0, None)
    area_b = np.clip(b[..., 2] - b[..., 0], 0, None) * np.clip(b[..., 3] - b[..., 1], 0, None)
    union = area_a + area_b - inter
    same = np.all(a == b, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)
    return np.where(same, 1.0, out)


def decode_detr(spec: DecodeSpec, outputs: dict) -> Decoded:
    logits = _squeeze_batch(outputs[spec.outputs["logits"]], 2, spec.outputs["logits"], spec.kind)
    boxes = _squeeze_batch(outputs[spec.outputs["boxes"]], 2, spec.outputs["boxes"], spec.kind)
    q, c = logits.shape
    n_cls = len(spec.classes) or c
    if n_cls > c:
        raise ParameterError("decode", f"output {spec.outputs['logits']!r} has {c} class columns; "
                                       f"the sidecar names {n_cls} classes", spec.kind)
    if boxes.shape != (q, 4):
        raise ParameterError("decode", f"output {spec.outputs['boxes']!r} has shape {list(boxes.shape)}; "
                                       f"expected [{q}, 4] (one box per query)", spec.kind)
    cols = np.asarray(logits[:, :n_cls], dtype=np.float64)
    cls = np.argmax(cols, axis=1).astype(np.int64)
    score = _sigmoid(cols[np.arange(q), cls])
    kept = score >= spec.threshold
    if spec.top_k is not None and spec.top_k < q:
        order = np.lexsort((np.arange(q), -score))   # score descending, then query index
        in_top = np.zeros(q, dtype=bool)
        in_top[order[: spec.top_k]] = True
        kept &= in_top
    box = cxcywh_to_xyxy(boxes) if spec.box_format.startswith("cxcywh") else np.asarray(boxes, dtype=np.float64)
    return Decoded(slot=np.arange(q, dtype=np.int64), cls=cls, score=score, kept=kept,
                   margin=score - spec.threshold, box=box)


def decode_classifier(spec: DecodeSpec, outputs: dict) -> Decoded:
    logits = _squeeze_batch(outputs[spec.outputs["logits"]], 1, spec.outputs["logits"], spec.kind)
    x = np.asarray(logits, dtype=np.float64)
    n_cls = len(spec.classes) or x.size
    if n_cls != x.size:   # fewer names took the first logits alone: another argmax, served without a word
        raise ParameterError("decode", f"output {spec.outputs['logits']!r} has {x.size} classes; the sidecar's "
                                       f"'classes' names {n_cls}: name one class per output column", spec.kind)
    x = x[:n_cls]
    p = np.exp(x - x.max())
    p /= p.sum()
    top = int(np.argmax(p))
    score = float(p[top])
    if spec.threshold is None:
        second = float(np.partition(p, -2)[-2]) if p.size > 1 else 0.0
        kept, margin = True, score - second
    else:
        kept, margin = score >= spec.threshold, score - spec.threshold
    return Decoded(slot=np.zeros(1, np.int64), cls=np.array([top], np.int64), score=np.array([score]),
                   kept=np.array([kept]), margin=np.array([margin]))


def label_regions(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """Connected components (4-connectivity) of a boolean mask over its last two axes.

    Leading axes (channels) are labelled independently. Labels are 1..n in
    raster order of each region's first pixel; 0 is background. Works on runs
    of each row with a union-find, so the Python loop is over runs, not pixels.
    """
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim < 2:
        mask = mask.reshape(1, -1)
    h, w = mask.shape[-2:]
    planes = mask.reshape(-1, h, w)
    labels = np.zeros(planes.shape, dtype=np.int64)
    parent: list[int] = []

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    runs = []  # (plane, row, start, stop, run id)
    for p in range(planes.shape[0]):
        prev: list = []
        for r in range(h):
            row = planes[p, r]
            if not row.any():
                prev = []
                continue
            d = np.diff(np.concatenate([[0], row.view(np.int8), [0]]))
            starts = np.flatnonzero(d == 1)
            stops = np.flatnonzero(d == -1)
            cur = []
            j = 0
            for s, e in zip(starts.tolist(), stops.tolist()):
                rid = len(parent)
                parent.append(rid)
                while j < len(prev) and prev[j][1] <= s:
                    j += 1
                k = j
                while k < len(prev) and prev[k][0] < e:
                    a, b = find(prev[k][2]), find(rid)
                    if a != b:
                        parent[max(a, b)] = min(a, b)
                    k += 1
                cur.append((s, e, rid))
                runs.append((p, r, s, e, rid))
            prev = cur
    roots: dict[int, int] = {}
    for p, r, s, e, rid in runs:
        root = find(rid)
        if root not in roots:
            roots[root] = len(roots) + 1
        labels[p, r, s:e] = roots[root]
    return labels.reshape(mask.shape), len(roots)


def decode_map(spec: DecodeSpec, outputs: dict) -> Decoded:
    prob = np.asarray(outputs[spec.outputs["map"]], dtype=np.float64)
    if prob.ndim < 2:
        raise ParameterError("decode", f"output {spec.outputs['map']!r} has shape {list(prob.shape)}; "
                                       f"expected a map of at least 2 dims", spec.kind)
    mask = prob >= spec.threshold
    labels, n = label_regions(mask)
    score = np.full(n, -np.inf)
    np.maximum.at(score, labels.ravel()[mask.ravel()] - 1, prob.ravel()[mask.ravel()])
    return Decoded(slot=np.arange(n, dtype=np.int64), cls=np.zeros(n, np.int64), score=score,
                   kept=np.ones(n, dtype=bool), margin=score - spec.threshold, mask=mask, labels=labels, prob=prob)


def decode_nms(spec: DecodeSpec, outputs: dict) -> Decoded:
    boxes = _squeeze_batch(outputs[spec.outputs["boxes"]], 2, spec.outputs["boxes"], spec.kind)
    scores = _squeeze_batch(outputs[spec.outputs["scores"]], 1, spec.outputs["scores"], spec.kind)
    labels = _squeeze_batch(outputs[spec.outputs["labels"]], 1, spec.outputs["labels"], spec.kind)
    n = scores.shape[0]
    if boxes.shape != (n, 4) or labels.shape != (n,):
        raise ParameterError("decode", f"boxes {list(boxes.shape)}, scores {list(scores.shape)}, "
                                       f"labels {list(labels.shape)} do not describe the same detections ([N,4], [N], [N])", spec.kind)
    score = np.asarray(scores, dtype=np.float64)
    box = cxcywh_to_xyxy(boxes) if spec.box_format.startswith("cxcywh") else np.asarray(boxes, dtype=np.float64)
    return Decoded(slot=np.arange(n, dtype=np.int64), cls=np.asarray(labels).astype(np.int64), score=score,
                   kept=score >= spec.threshold, margin=score - spec.threshold, box=box)


def _yolo_layout(spec: DecodeSpec, shape, name: str) -> str:
    """channels-first ([4+C, N]) or channels-last ([N, 4+C]): the sidecar's, else the one axis that fits."""
    if spec.layout:
        return spec.layout
    nc = len(spec.classes)
    hint = "set 'layout' (channels-first or channels-last) in the sidecar decode block"
    if nc:
        want = {4 + nc, 5 + nc} if spec.objectness is None else {4 + int(spec.objectness) + nc}
        first, last = shape[0] in want, shape[1] in want
        if first != last:
            return "channels-first" if first else "channels-last"
        if not first:
            raise ParameterError("decode", f"output {name!r} has shape {list(shape)}: neither axis has "
                                           f"{' or '.join(map(str, sorted(want)))} channels for the sidecar's {nc} classes; "
                                           f"fix 'classes' or {hint}", "yolo")
    if shape[0] != shape[1]:   # both or no class count fits: boxes outnumber channels
        return "channels-first" if shape[0] < shape[1] else "channels-last"
    raise ParameterError("decode", f"output {name!r} has shape {list(shape)}: cannot tell channels from boxes; "
                                   f"{hint}, or name the 'classes'", "yolo")


def nms(box: np.ndarray, score: np.ndarray, cls: np.ndarray, iou_threshold: float, max_det: int) -> np.ndarray:
    """Class-aware greedy NMS: indices of the survivors, by score descending (ties: lower index first).

    A box is suppressed by a higher-ranked survivor of its class with IoU > iou_threshold
    (torchvision's rule). float64 throughout, so the survivors depend only on the inputs.
    """
    n = score.size
    order = np.lexsort((np.arange(n), -np.asarray(score, np.float64)))
    alive = np.ones(n, dtype=bool)
    keep: list[int] = []
    for pos, i in enumerate(order.tolist()):
        if not alive[i]:
            continue
        keep.append(i)
        if len(keep) >= max_det:
            break
        rest = order[pos + 1:]
        rest = rest[alive[rest] & (cls[rest] == cls[i])]
        if rest.size:
            alive[rest[iou(box[i][None, :], box[rest]) > iou_threshold]] = False
    return np.asarray(keep, dtype=np.int64)


def decode_yolo(spec: DecodeSpec, outputs: dict) -> Decoded:
    name = spec.outputs["output"]
    a = _squeeze_batch(outputs[name], 2, name, spec.kind)
    layout = _yolo_layout(spec, a.shape, name)
    a = np.asarray(a.T if layout == "channels-first" else a, dtype=np.float64)   # [N, channels]
    n, ch = a.shape
    nc = len(spec.classes)
    obj = spec.objectness if spec.objectness is not None else bool(nc) and ch == 5 + nc
    n_cls = ch - 4 - int(obj)
    if n_cls < 1 or (nc and n_cls != nc):
        raise ParameterError("decode", f"output {name!r} has {ch} channels ({layout}); expected 4 box + "
                                       f"{'1 objectness + ' if obj else ''}{nc or 'C'} class channels; fix 'classes', 'layout' "
                                       f"or 'objectness' in the sidecar", "yolo")
    probs = a[:, 4 + int(obj):]
    if obj:
        probs = probs * a[:, 4:5]
    return _nms_decoded(spec, a[:, :4], probs)


def _nms_decoded(spec: DecodeSpec, boxes: np.ndarray, probs: np.ndarray) -> Decoded:
    """Raw head rows -> decisions: class = argmax of `probs` ([N, C]), score its value; rows scoring at least the
    candidate threshold enter class-aware NMS; the first max_det survivors, kept at the threshold. `boxes`: [N, 4]
    in spec.box_format."""
    n = probs.shape[0]
    cls = np.argmax(probs, axis=1).astype(np.int64)
    score = probs[np.arange(n), cls]
    cand = np.flatnonzero(score >= spec.candidate_threshold)   # NaN scores are never candidates
    box = boxes[cand]
    box = cxcywh_to_xyxy(box) if spec.box_format.startswith("cxcywh") else box
    keep = nms(box, score[cand], cls[cand], spec.iou, spec.max_det)
    idx = cand[keep]
    sc = score[idx]
    return Decoded(slot=idx.astype(np.int64), cls=cls[idx], score=sc, kept=sc >= spec.threshold,
                   margin=sc - spec.threshold, box=box[keep])


def yolox_grids(n_rows: int, strides, input_size) -> tuple[np.ndarray, np.ndarray]:
    """(grid [N, 2] x, y; stride [N]) of a YOLOX head's rows; input_size None: the square size that gives n_rows.

    ValueError when the rows do not fit."""
    strides = list(strides)
    if input_size is None:
        side = int(round(math.sqrt(n_rows / sum(1.0 / (s * s) for s in strides))))
        input_size = (side, side)
    h, w = input_size
    grids, steps = [], []
    for s in strides:
        ys, xs = np.meshgrid(np.arange(h // s), np.arange(w // s), indexing="ij")
        grids.append(np.stack([xs.ravel(), ys.ravel()], axis=1))
        steps.append(np.full(xs.size, s, np.float64))
    grid = np.concatenate(grids).astype(np.float64)
    if grid.shape[0] != n_rows:
        raise ValueError(f"input {h}x{w} with strides {strides} gives {grid.shape[0]} grid rows")
    return grid, np.concatenate(steps)


def decode_yolox(spec: DecodeSpec, outputs: dict) -> Decoded:
    name = spec.outputs["output"]
    a = _squeeze_batch(outputs[name], 2, name, spec.kind)
    layout = spec.layout or ("channels-first" if a.shape[0] < a.shape[1] else "channels-last")
    a = np.asarray(a.T if layout == "channels-first" else a, dtype=np.float64)   # [N, 5 + C]
    n, ch = a.shape
    nc = len(spec.classes)
    if ch < 6 or (nc and ch != 5 + nc):
        raise ParameterError("decode", f"output {name!r} has {ch} channels ({layout}); expected 4 box + "
                                       f"1 objectness + {nc or 'C'} class channels; fix 'classes' or 'layout' in the sidecar", "yolox")
    try:
        grid, stride = yolox_grids(n, spec.strides, spec.input_size)
    except ValueError as exc:
        raise ParameterError("decode", f"output {name!r} has {n} rows, but {exc}; set 'input_size' "
                                       f"[height, width] and 'strides' in the sidecar decode block", "yolox") from None
    with np.errstate(over="ignore"):
        boxes = np.concatenate([(a[:, :2] + grid) * stride[:, None], np.exp(a[:, 2:4]) * stride[:, None]], axis=1)
    return _nms_decoded(replace(spec, box_format="cxcywh"), boxes, a[:, 5:] * a[:, 4:5])


def _ctc_steps(spec: DecodeSpec, a: np.ndarray, name: str) -> np.ndarray:
    """The [T, C] steps of one fixture's ctc output, by the layout the run's actual shape has."""
    a = np.asarray(a)
    if a.ndim == 2:
        return a
    if a.ndim != 3:
        raise ParameterError("decode", f"output {name!r} has shape {list(a.shape)}; expected [T, N, C] or [N, T, C] "
                                       "with a batch of one", "ctc")
    layout = spec.layout
    if layout is None:
        if (a.shape[0] == 1) == (a.shape[1] == 1):
            raise ParameterError("decode", f"output {name!r} has shape {list(a.shape)}: cannot tell time from batch; "
                                           "set 'layout' (TNC or NTC) in the sidecar decode block", "ctc")
        layout = "TNC" if a.shape[1] == 1 else "NTC"
    n = a.shape[1] if layout == "TNC" else a.shape[0]
    if n != 1:
        raise ParameterError("decode", f"output {name!r} has shape {list(a.shape)} ({layout}): batch {n}, "
                                       "expected one; fix 'layout' in the sidecar decode block", "ctc")
    return a[:, 0, :] if layout == "TNC" else a[0]


def ctc_text(spec: DecodeSpec, ids) -> str:
    """The string of collapsed, blank-free class ids: the alphabet's characters (class c > blank is entry c - 1)."""
    if spec.alphabet is None:
        return " ".join(str(int(c)) for c in ids)
    return "".join(spec.alphabet[int(c) - (c > spec.blank)] for c in ids)


def decode_ctc(spec: DecodeSpec, outputs: dict) -> Decoded:
    name = spec.outputs["output"]
    x = np.asarray(_ctc_steps(spec, outputs[name], name), dtype=np.float64)
    t, c = x.shape
    if spec.alphabet is not None and c != len(spec.alphabet) + 1:
        raise ParameterError("decode", f"output {name!r} has {c} classes per step; the alphabet (with space) has "
                                       f"{len(spec.alphabet)} characters + 1 blank = {len(spec.alphabet) + 1}", "ctc")
    if not 0 <= spec.blank < c:
        raise ParameterError("decode", f"blank {spec.blank} is not one of the {c} classes of output {name!r}", "ctc")
    if t and np.all(x >= 0) and np.allclose(x.sum(axis=1), 1.0, atol=1e-3):
        p = x                                         # already probabilities (PaddleOCR exports a softmax)
    else:
        e = np.exp(x - x.max(axis=1, keepdims=True))
        p = e / e.sum(axis=1, keepdims=True)
    best = np.argmax(x, axis=1).tolist()
    ids = [k for i, k in enumerate(best) if k != spec.blank and (i == 0 or k != best[i - 1])]
    top2 = np.sort(np.concatenate([np.zeros((t, 1)), p], axis=1), axis=1)[:, -2:]
    score = float(top2[:, 1].mean()) if t else 1.0
    margin = float((top2[:, 1] - top2[:, 0]).min()) if t else math.nan
    return Decoded(slot=np.zeros(1, np.int64), cls=np.zeros(1, np.int64), score=np.array([score]),
                   kept=np.ones(1, bool), margin=np.array([margin]), text=[ctc_text(spec, ids)])


PLUGIN_KEYS = ("cls", "score", "kept", "box", "slot", "margin")


#: the most decisions a decode plug-in may return for one fixture (docs/your-model.md): every decision is a row of
#: the decisions table on every host and variant, so 200k per fixture grew to 1.9 GB
MAX_PLUGIN_DECISIONS = 10_000


def _check_plugin_size(ref: str, result: Mapping) -> None:
    """At most MAX_PLUGIN_DECISIONS per fixture, checked before any array is copied."""
    def count(v) -> int:
        try:
            return len(v)
        except TypeError:   # a scalar, a 0-d array: the shape checks name it
            return 0

    sizes = [count(v) for k, v in result.items() if k in PLUGIN_KEYS]
    if max(sizes, default=0) > MAX_PLUGIN_DECISIONS:
        raise UserError(f"decode plug-in {ref}: returned {max(sizes)} decisions for one fixture; at most "
                        f"{MAX_PLUGIN_DECISIONS} (keep the candidates your product serves, e.g. after its threshold "
                        f"or NMS)")


def plugin_decoded(ref: str, result, threshold: float | None) -> Decoded:
    """A decode plug-in's dict checked and wrapped into Decoded; errors name the plug-in."""
    def bad(problem: str) -> UserError:
        return UserError(f"decode plug-in {ref}: {problem}; it must return a dict of 1-D arrays cls, score, kept "
                         f"(optional box [n, 4] xyxy, slot, margin)")

    if not isinstance(result, Mapping):
        raise bad(f"returned {type(result).__name__}, not a dict")
    _check_plugin_size(ref, result)
    missing = [k for k in ("cls", "score", "kept") if k not in result]
    unknown = sorted(str(k) for k in result if k not in PLUGIN_KEYS)
    if missing or unknown:
        raise bad(f"{'missing ' + ', '.join(missing) if missing else ''}"
                  f"{'; ' if missing and unknown else ''}{'unknown key(s) ' + ', '.join(unknown) if unknown else ''}")
    arr = {}
    for k in PLUGIN_KEYS:
        if result.get(k) is None:
            continue
        try:
            arr[k] = np.asarray(result[k])
        except Exception as exc:  # noqa: BLE001 - any array-unfriendly value is the plug-in's mistake
            raise bad(f"{k!r} is not an array ({type(exc).__name__})") from None
    n = arr["score"].size if arr["score"].ndim == 1 else -1
    for k, v in arr.items():
        want = (n, 4) if k == "box" else (n,)
        if v.shape != want or n < 0:
            raise bad(f"{k!r} has shape {list(v.shape)}, expected {list(want) if n >= 0 else '1-D'} "
                      f"(every array one entry per decision)")
    def numeric(k, kinds):
        if arr[k].dtype.kind not in kinds:
            raise bad(f"{k!r} has dtype {arr[k].dtype}, not a number")
        return arr[k].astype(np.float64)

    cls_f = numeric("cls", "biuf")
    if not np.all(np.isfinite(cls_f)) or np.any(cls_f != np.round(cls_f)):
        raise bad("'cls' holds non-integer values")
    score = numeric("score", "biuf")
    if not np.all(np.isfinite(score)):
        raise bad("'score' holds NaN or infinite values")
    kept_v = arr["kept"]
    if kept_v.dtype.kind not in "biu" or not np.all((kept_v == 0) | (kept_v == 1)):
        raise bad(f"'kept' must be booleans (got dtype {kept_v.dtype})")
    slot = np.arange(n, dtype=np.int64)
    if "slot" in arr:
        sf = numeric("slot", "biu")
        slot = sf.astype(np.int64)
        if np.unique(slot).size != n:
            raise bad("'slot' ids repeat")
    box = None
    if "box" in arr:
        box = numeric("box", "biuf")
        if not np.all(np.isfinite(box)):
            raise bad("'box' holds NaN or infinite values")
    if "margin" in arr:
        margin = numeric("margin", "biuf")
    else:
        margin = score - threshold if threshold is not None else np.full(n, math.nan)
    return Decoded(slot=slot, cls=cls_f.astype(np.int64), score=score, kept=kept_v.astype(bool), margin=margin,
                   box=box)


def _takes_geometry(fn) -> bool:
    """A plug-in declaring a `geometry` parameter (or **kwargs) is given it; one written before it is not."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):   # a builtin or a callable without a signature: called as before
        return False
    return any(p.kind is p.VAR_KEYWORD or (p.name == "geometry" and p.kind is not p.POSITIONAL_ONLY) for p in params)


def decode_plugin(spec: DecodeSpec, outputs: dict, geometry: dict | None = None) -> Decoded:
    """Run a decode plug-in on one fixture; `geometry` (preprocess.Geometry.as_dict, None when unknown) goes to
    a plug-in that declares it, as `geometry=`."""
    fn = plugins.load(spec.kind, flag_mark("decode"))
    try:
        if _takes_geometry(fn):
            result = fn(dict(outputs), spec, geometry=None if geometry is None else dict(geometry))
        else:
            result = fn(dict(outputs), spec)
    except UserError:
        raise
    except plugins.FAILURES as exc:  # user code (sys.exit too): one line naming it, never a traceback
        raise UserError(f"decode plug-in {spec.kind}: raised {plugins.one_line(exc)}") from None
    return plugin_decoded(spec.kind, result, spec.threshold)


_BUILTIN = {k.name: k for k in (
    DecoderKind("detr-sigmoid", decode_detr, {"logits": "pred_logits", "boxes": "pred_boxes"}, threshold=0.5,
                probability=True, box_format="cxcywh", metric="AP", box_frame="normalized"),
    DecoderKind("classifier-softmax", decode_classifier, {"logits": "logits"}, probability=True, metric="top-1",
                no_threshold_margin="fp32 top-1 minus top-2 probability", one_decision=True),
    DecoderKind("threshold-map", decode_map, {"map": "map"}, threshold=0.5, probability=True, one_output=True,
                compare="map", box_frame="normalized", metric="AP", class_agnostic=True,
                # a region appears or vanishes as its peak pixel crosses the threshold; a region changing shape
                # (box-shift) is decided by no score, so its peak (often 1) is left out of the band
                threshold_margin="fp32 region peak probability minus threshold",
                band_subject="every region that appeared or vanished against fp32",
                band_words="an fp32 peak probability (its highest pixel)", margin_flips=("threshold",)),
    DecoderKind("nms-boxes", decode_nms, {"boxes": "boxes", "scores": "scores", "labels": "labels"}, threshold=0.5,
                compare="matched", metric="AP"),
    NmsKind("yolo", decode_yolo, {"output": "output0"}, threshold=0.25, probability=True),
    YoloxKind("yolox", decode_yolox, {"output": "output"}, threshold=0.3),
    CtcKind("ctc", decode_ctc, {"output": "output"}),
)}
NONE_KIND = NoneKind(NONE)
KINDS = tuple(_BUILTIN)   # the built-in decoders, in the order help and errors list them


def decode(spec: DecodeSpec, outputs: dict, geometry: dict | None = None) -> Decoded:
    """Decode one fixture's outputs (name -> array). `geometry`: where its image went in the input
    (preprocess.Geometry.as_dict; None: unknown), for a kind that takes it (a plug-in declaring it)."""
    kind = spec.decoder_kind
    if not kind.decides:
        raise ValueError("decode none has no decisions; callers check spec.decoder_kind.decides first")
    if kind.takes_geometry:
        return kind.decoder(spec, outputs, geometry)
    return kind.decoder(spec, outputs)


def spec_for_variant(variant, kind: str | None = None, outputs: list | None = None) -> DecodeSpec | None:
    """The decode spec of a variant's sidecar (or `kind`), checked against its outputs (`outputs`: the graph's
    output names when the caller has them, else the model is read); None under decode none."""
    spec = spec_from_sidecar(sidecar_for(variant), kind, source=str(variant.path))
    if not spec.decoder_kind.decides:
        return None
    if outputs is None:
        outputs = [o.name for o in load_model(variant.path, check=False).graph.output]
    return check_outputs(spec, outputs)

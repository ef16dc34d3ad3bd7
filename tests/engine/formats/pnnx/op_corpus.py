"""One small model per pnnx operator type the lowering handles, cut out of the committed real exports (each
operator line with what feeds it: its graph-input operands become pnnx.Input lines, constants and scalar
expressions that feed it come along), and ways to mistype it: an operand of another dtype or rank, an extra or a
missing operand, two operands in each other's role.

Types no fixture holds take a sibling's line (the same handler, e.g. `Tensor.sum` from `torch.sum`) or a line
written here (SAMPLES) for the forms pnnx writes differently (functional ops with weight operands).
"""

from __future__ import annotations

import difflib
import glob
import re
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from engine.formats.pnnx.lowering.lower import HANDLERS
from engine.formats.pnnx.param_values import annotation_dtype, parse_annotation
from engine.formats.pnnx.writer import write_pnnx

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
DYNAMIC_DIM = 4  # what a `?` dim of a graph input becomes
RNG = np.random.default_rng(18)


@dataclass
class Line:
    """One operator line: type, name, operand names, and its items kept as text (in order)."""
    type: str
    name: str
    ins: list[str]
    outs: list[str]
    items: list[str]

    @classmethod
    def parse(cls, text: str) -> Line:
        tok = text.split()
        n_in, n_out = int(tok[2]), int(tok[3])
        return cls(tok[0], tok[1], tok[4:4 + n_in], tok[4 + n_in:4 + n_in + n_out], tok[4 + n_in + n_out:])

    def text(self) -> str:
        return " ".join([self.type, self.name, str(len(self.ins)), str(len(self.outs)), *self.ins, *self.outs,
                         *self.items])

    def note(self, operand: str) -> str | None:
        return next((i.split("=", 1)[1] for i in self.items if i.startswith(f"#{operand}=")), None)

    def tag(self, operand: str) -> str | None:
        return next((i[1:].split("=", 1)[0] for i in self.items if i.startswith("$") and i.endswith(f"={operand}")),
                    None)


@dataclass
class Sample:
    """A model around one operator line: graph inputs (operand -> annotation), feeding lines, weights."""
    op: Line
    inputs: dict[str, str]
    feeders: list[Line] = field(default_factory=list)
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    source: str = ""
    graph_outputs: list[str] | None = None  # default: all of the operator's outputs (else the followers')
    followers: list[Line] = field(default_factory=list)  # lines reading a list the operator makes (ListUnpack)

    def text(self) -> str:
        lines = [f"pnnx.Input in_{i} 0 1 {op} #{op}={note}" for i, (op, note) in enumerate(self.inputs.items())]
        lines += [f.text() for f in self.feeders] + [self.op.text()] + [f.text() for f in self.followers]
        outs = self.graph_outputs or (self.followers[-1].outs if self.followers else self.op.outs)
        lines.append(f"pnnx.Output out {len(outs)} 0 {' '.join(outs)}")
        return f"7767517\n{len(lines)} {len(lines)}\n" + "\n".join(lines) + "\n"

    def write(self, path: Path) -> Path:
        return write_pnnx(path, self.text(), self.weights)


def _concrete(note: str) -> str:
    return re.sub(r"(?<=[(,])\?(?=[,)])", str(DYNAMIC_DIM), note)


def _concrete_notes(line: Line, operands: set[str]) -> Line:
    """The line with `?` dims of these operands' notes made concrete (each line re-annotates what it reads)."""
    items = [_concrete(i) if i.startswith("#") and i[1:].split("=", 1)[0] in operands else i for i in line.items]
    return replace(line, items=items)


def _cut(path: Path, lines: list[Line], index: int) -> Sample | None:
    """The operator at `index` of a file with its feeders; None when an operand has no annotation to start
    from (a list computed from other operators' outputs)."""
    op = lines[index]
    producers = {o: ln for ln in lines[:index] for o in ln.outs}
    read = {o for ln in lines[index + 1:] for o in ln.ins}
    outs = [o for o in op.outs if o in read] or op.outs[:1]  # outputs nothing reads (pool indices) stay out
    sample = Sample(replace(op, items=list(op.items), outs=op.outs), {}, source=f"{path.parent.name}:{index + 3}")
    sample.graph_outputs = outs
    with zipfile.ZipFile(path.with_name("model.pnnx.bin")) as z:
        for operand in dict.fromkeys(op.ins):
            prod = producers.get(operand)
            constant = prod is not None and (prod.type == "pnnx.Attribute" or
                                             (prod.type == "pnnx.Expression" and not prod.ins))
            if constant:
                sample.feeders.append(prod)
                if prod.type == "pnnx.Attribute":
                    sample.weights[f"{prod.name}.data"] = _entry(z, prod, "data")
                continue
            if prod is not None and prod.type == "pnnx.Expression" and op.note(operand) is None:
                for x in prod.ins:  # a list expression (`[size(@0,2),size(@0,3)]`, `[@0]`): its tensors are inputs
                    note = prod.note(x)
                    if note is None:
                        return None
                    sample.inputs.setdefault(x, _concrete(note))
                sample.feeders.append(_concrete_notes(prod, set(prod.ins)))
                continue
            note = op.note(operand)
            if note is None:
                return None
            sample.inputs[operand] = _concrete(note)
        sample.op = _concrete_notes(sample.op, set(sample.inputs))
        for item in op.items:
            if item.startswith("@"):
                sample.weights[f"{op.name}.{item[1:].split('=', 1)[0]}"] = _entry(z, op, item[1:].split("=", 1)[0])
    if any(d == 0 for note in sample.inputs.values() for d in parse_annotation(note)[0]):
        return None  # the runtime takes no empty inputs (an empty value inside a graph is fine)
    if op.type in LIST_MAKERS:  # a list is no graph output: the prim::ListUnpack reading it comes along
        sample.followers = [ln for ln in lines[index + 1:] if ln.type == "prim::ListUnpack" and ln.ins == op.outs]
        sample.graph_outputs = None
    return sample


LIST_MAKERS = ("aten::meshgrid", "prim::ListConstruct")


def _entry(z: zipfile.ZipFile, line: Line, attr: str) -> np.ndarray:
    spec = next(i for i in line.items if i.startswith(f"@{attr}="))
    shape, code = parse_annotation(spec.split("=", 1)[1], allow_unknown=False)
    return np.frombuffer(z.read(f"{line.name}.{attr}"), annotation_dtype(code)).reshape(shape)


# Types pnnx writes in more forms than two distinct param sets show: Tensor.index's inline constant indices
# (`expr=[[2,0],[1,3]]`, one operand) and its `$expr` list operand (`[@0,sub(@1,1)]`).
SAMPLES_PER_TYPE = {"Tensor.index": 3}


def fixture_samples() -> dict[str, list[Sample]]:
    """Per operator type, the samples cut from the committed exports (the first two distinct param sets, or
    SAMPLES_PER_TYPE's count)."""
    out: dict[str, list[Sample]] = {}
    seen: set[tuple[str, str]] = set()
    for p in sorted(glob.glob(str(FIXTURES / "pnnx*" / "*" / "model.pnnx.param"))):
        lines = [Line.parse(t) for t in Path(p).read_text().splitlines()[2:] if t.strip()]
        for i, ln in enumerate(lines):
            if ln.type not in HANDLERS:
                continue
            key = (ln.type, " ".join(sorted(it for it in ln.items if it[0] not in "#@$")))
            if key in seen or len(out.get(ln.type, [])) >= SAMPLES_PER_TYPE.get(ln.type, 2):
                continue
            sample = _cut(Path(p), lines, i)
            if sample is not None:
                seen.add(key)
                out.setdefault(ln.type, []).append(sample)
    return out


# Forms no fixture holds and no sibling's line can stand for: functional ops with a constant weight operand (pnnx
# turns those into nn.* modules; only run-time weights keep the functional form, and those are refused), creation
# ops whose sizes a fixture never computes at run time, Tensor.copy (pnnx drops a plain copy_, see OPERATORS.md).
# type -> (operator line, graph inputs, pnnx.Attribute operands and their shapes)
SAMPLES: dict[str, tuple[str, dict[str, str], dict[str, tuple[int, ...]]]] = {
    "F.conv2d": ("F.conv2d op 2 1 x w y bias=None dilation=(1,1) groups=1 padding=(1,1) stride=(1,1) $input=x "
                 "$weight=w #x=(1,2,5,5)f32 #y=(1,4,5,5)f32", {"x": "(1,2,5,5)f32"}, {"w": (4, 2, 3, 3)}),
    "F.conv3d": ("F.conv3d op 2 1 x w y bias=None dilation=(1,1,1) groups=1 padding=(1,1,1) stride=(1,1,1) "
                 "$input=x $weight=w #x=(1,2,3,5,5)f32 #y=(1,4,3,5,5)f32", {"x": "(1,2,3,5,5)f32"},
                 {"w": (4, 2, 3, 3, 3)}),
    "nn.AvgPool3d": ("nn.AvgPool3d op 1 1 x y ceil_mode=False count_include_pad=True divisor_override=None "
                     "kernel_size=(2,2,2) padding=(0,0,0) stride=(2,2,2) #x=(1,2,4,4,4)f32 #y=(1,2,2,2,2)f32",
                     {"x": "(1,2,4,4,4)f32"}, {}),
    "F.conv1d": ("F.conv1d op 2 1 x w y bias=None dilation=(1) groups=1 padding=(1) stride=(1) $input=x $weight=w "
                 "#x=(1,2,5)f32 #y=(1,4,5)f32", {"x": "(1,2,5)f32"}, {"w": (4, 2, 3)}),
    "F.conv_transpose1d": ("F.conv_transpose1d op 2 1 x w y bias=None dilation=(1) groups=1 output_padding=(0) "
                           "padding=(0) stride=(2) $input=x $weight=w #x=(1,2,5)f32 #y=(1,4,11)f32",
                           {"x": "(1,2,5)f32"}, {"w": (2, 4, 3)}),
    "F.conv_transpose2d": ("F.conv_transpose2d op 2 1 x w y bias=None dilation=(1,1) groups=1 "
                           "output_padding=(0,0) padding=(0,0) stride=(2,2) $input=x $weight=w #x=(1,2,5,5)f32 "
                           "#y=(1,4,11,11)f32", {"x": "(1,2,5,5)f32"}, {"w": (2, 4, 3, 3)}),
    "F.linear": ("F.linear op 2 1 x w y bias=None $input=x $weight=w #x=(2,3,4)f32 #y=(2,3,6)f32",
                 {"x": "(2,3,4)f32"}, {"w": (6, 4)}),
    "F.prelu": ("F.prelu op 2 1 x w y $input=x $weight=w #x=(2,3,4)f32 #y=(2,3,4)f32", {"x": "(2,3,4)f32"},
                {"w": (3,)}),
    "F.rms_norm": ("F.rms_norm op 2 1 x w y eps=1.000000e-5 normalized_shape=(4) $input=x $weight=w #x=(2,3,4)f32 "
                   "#y=(2,3,4)f32", {"x": "(2,3,4)f32"}, {"w": (4,)}),
    "Tensor.copy": ("Tensor.copy op 2 1 x src y $self=x $src=src #x=(2,3,4)f32 #src=(3,4)f32 #y=(2,3,4)f32",
                    {"x": "(2,3,4)f32", "src": "(3,4)f32"}, {}),
    "torch.squeeze": ("torch.squeeze op 1 1 x y dim=1 $input=x #x=(2,1,4)f32 #y=(2,4)f32", {"x": "(2,1,4)f32"}, {}),
    "Tensor.squeeze": ("Tensor.squeeze op 1 1 x y dim=1 $input=x #x=(2,1,4)f32 #y=(2,4)f32", {"x": "(2,1,4)f32"},
                       {}),
    "torch.logical_and": ("torch.logical_and op 2 1 a b y $input=a $other=b #a=(2,3)bool #b=(2,1)bool #y=(2,3)bool",
                          {"a": "(2,3)bool", "b": "(2,1)bool"}, {}),
    "torch.select_scatter": ("torch.select_scatter op 2 1 x src y dim=1 index=-1 $input=x $src=src #x=(3,4)f32 "
                             "#src=(3)f32 #y=(3,4)f32", {"x": "(3,4)f32", "src": "(3)f32"}, {}),
    "torch.mm": ("torch.mm op 2 1 a b y $input=a $mat2=b #a=(3,4)f32 #b=(4,5)f32 #y=(3,5)f32",
                 {"a": "(3,4)f32", "b": "(4,5)f32"}, {}),
    "Tensor.view_as": ("Tensor.view_as op 2 1 x o y $input=x $other=o #x=(2,6)f32 #o=(3,4)f32 #y=(3,4)f32",
                       {"x": "(2,6)f32", "o": "(3,4)f32"}, {}),
    "torch.tril": ("torch.tril op 1 1 x y diagonal=1 $input=x #x=(3,4)f32 #y=(3,4)f32", {"x": "(3,4)f32"}, {}),
    "nn.LocalResponseNorm": ("nn.LocalResponseNorm op 1 1 x y alpha=0.0001 beta=0.75 k=1.0 size=3 #x=(1,4,3,3)f32 "
                             "#y=(1,4,3,3)f32", {"x": "(1,4,3,3)f32"}, {}),
    "F.local_response_norm": ("F.local_response_norm op 1 1 x y alpha=0.0001 beta=0.75 k=1.0 size=3 $input=x "
                              "#x=(1,4,3,3)f32 #y=(1,4,3,3)f32", {"x": "(1,4,3,3)f32"}, {}),
    "F.grid_sample": ("F.grid_sample op 2 1 x g y align_corners=False mode=bilinear padding_mode=zeros $input=x "
                      "$grid=g #x=(1,2,4,5)f32 #g=(1,3,3,2)f32 #y=(1,2,3,3)f32",
                      {"x": "(1,2,4,5)f32", "g": "(1,3,3,2)f32"}, {}),
    "torch.masked_select": ("torch.masked_select op 2 1 x m y $input=x $mask=m #x=(2,3)f32 #m=(3)bool #y=(?)f32",
                            {"x": "(2,3)f32", "m": "(3)bool"}, {}),
    "torch.zeros": ("torch.zeros op 1 1 s y dtype=torch.float $size=s #y=(?,3)f32", {"x": "(2,3)f32"}, {}),
    "torch.empty": ("torch.empty op 1 1 s y dtype=None $size=s #y=(?,3)f32", {"x": "(2,3)f32"}, {}),
    "torch.empty_like": ("torch.empty_like op 1 1 x y dtype=None $input=x #x=(2,3)f32 #y=(2,3)f32",
                         {"x": "(2,3)f32"}, {}),
    "Tensor.new_empty": ("Tensor.new_empty op 2 1 x s y dtype=None $input=x $size=s #x=(2,3)f32 #y=(?,3)f32",
                         {"x": "(2,3)f32"}, {}),
    "Tensor.new_full": ("Tensor.new_full op 2 1 x s y dtype=None fill_value=2.5 $input=x $size=s #x=(2,3)f32 "
                        "#y=(?,3)f32", {"x": "(2,3)f32"}, {}),
    # F.normalize's `norm.clamp_min(eps)` as pnnx leaves it unfolded; the bound here a run-time tensor
    "aten::clamp_min": ("aten::clamp_min op 2 1 x b y #x=(2,3)f32 #b=(2,1)f32 #y=(2,3)f32",
                        {"x": "(2,3)f32", "b": "(2,1)f32"}, {}),
    "aten::clamp_max": ("aten::clamp_max op 2 1 x b y #x=(2,3)f32 #b=(2,1)f32 #y=(2,3)f32",
                        {"x": "(2,3)f32", "b": "(2,1)f32"}, {}),
}
SAMPLES |= {
    "prim::ListUnpack": ("prim::ListUnpack op 1 2 l y0 y1 #y0=(2,3)f32 #y1=(2,3)f32",
                         {"a": "(2,3)f32", "b": "(2,3)f32"}, {}),
    "prim::ListConstruct": ("prim::ListConstruct op 2 1 a b l #a=(2,3)f32 #b=(3)f32", {"a": "(2,3)f32", "b": "(3)f32"},
                            {}),
}
SIZE_FEEDER = "pnnx.Expression size_expr 1 1 x s expr=[size(@0,0),3] #x=(2,3)f32"
LIST_FEEDER = "pnnx.Expression list_expr 2 1 a b l expr=[@0,mul(@1,2.0)] #a=(2,3)f32 #b=(2,3)f32"
LIST_FOLLOWER = "prim::ListUnpack unpack 1 2 l y0 y1 #y0=(2,3)f32 #y1=(3)f32"


def written_sample(op_type: str) -> Sample:
    text, inputs, weights = SAMPLES[op_type]
    op = Line.parse(text)
    sample = Sample(op, dict(inputs), source="op_corpus.SAMPLES")
    for operand, shape in weights.items():
        note = "(" + ",".join(map(str, shape)) + ")f32"
        sample.feeders.append(Line("pnnx.Attribute", operand, [], [operand], [f"@data={note}", f"#{operand}={note}"]))
        sample.weights[f"{operand}.data"] = RNG.standard_normal(shape).astype(np.float32)
    if "s" in op.ins:
        sample.feeders.insert(0, Line.parse(SIZE_FEEDER))
    if "l" in op.ins:
        sample.feeders.insert(0, Line.parse(LIST_FEEDER))
    if op.type in LIST_MAKERS:
        sample.followers.append(Line.parse(LIST_FOLLOWER))
    return sample


def _sibling(op_type: str, candidates: list[str]) -> str | None:
    """The type whose line can stand for `op_type`: the same kind (aten:: positional operands or not), then the
    most similar name (Tensor.view_as takes Tensor.reshape_as's line)."""
    same = [t for t in candidates if t.startswith("aten::") == op_type.startswith("aten::")]
    return max(same, key=lambda t: difflib.SequenceMatcher(None, t, op_type).ratio(), default=None)


def samples() -> dict[str, list[Sample]]:
    """Every handled pnnx type's samples: from the fixtures, else a sibling's line renamed, else SAMPLES."""
    found = fixture_samples() | {t: [written_sample(t)] for t in SAMPLES}
    out: dict[str, list[Sample]] = {}
    for op_type in sorted(HANDLERS):
        if op_type in SAMPLES or op_type in found:
            out[op_type] = found[op_type]
        else:
            sibling = _sibling(op_type, [t for t in sorted(found) if HANDLERS[t] is HANDLERS[op_type]])
            if sibling is not None:
                s = found[sibling][0]
                out[op_type] = [replace(s, op=replace(s.op, type=op_type, items=list(s.op.items)),
                                        source=f"{s.source} ({sibling} renamed)")]
    return out

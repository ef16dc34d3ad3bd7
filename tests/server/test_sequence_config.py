"""The sequence_batching block of a config.pbtxt as the sequence batcher's settings (server/sequence_batching.py):
defaults, both strategies, control tensors, initial states, and each refusal naming the field."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from server import config as cfg
from server.backend import SequenceFlags
from server.errors import ModelLoadError
from server.scheduling.sequence_inputs import control_tensors
from server.sequence_batching import sequence_config

BASE = 'name: "m"\nmax_batch_size: 4\ninput [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'


def parse(text: str, model_dir: Path | None = None):  # noqa: ANN201 - SequenceConfig
    return sequence_config(cfg.parse_config_text(BASE + text), "m", model_dir or Path("/nonexistent"))


def test_defaults_are_tritons() -> None:
    seq = parse("sequence_batching { }")
    assert seq.policy.strategy == "direct"
    assert seq.policy.idle_ns == 1_000_000_000
    assert seq.policy.slots_per_instance == 4  # max_batch_size slots per instance
    assert seq.controls == () and seq.states == ()


def test_oldest_knobs() -> None:
    seq = parse("sequence_batching { max_sequence_idle_microseconds: 5000 oldest { max_candidate_sequences: 6 "
                "preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 100 } }")
    policy = seq.policy
    assert (policy.strategy, policy.slots_per_instance, policy.preferred_batch_sizes) == ("oldest", 6, (2, 4))
    assert (policy.idle_ns, policy.max_queue_delay_ns) == (5_000_000, 100_000)


def test_control_tensors_as_triton_makes_them() -> None:
    seq = parse("""sequence_batching { control_input [
        { name: "S" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0.5, 2.5 ] } ] },
        { name: "E" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
        { name: "R" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 3, 4 ] } ] },
        { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT32 } ] } ] }""")
    tensors = control_tensors(seq.controls, SequenceFlags(2**32 + 9, start=True), batched=True)
    assert {k: (v.dtype, v.shape, v.tolist()) for k, v in tensors.items()} == {
        "S": (np.float32, (1, 1), [[2.5]]), "E": (np.bool_, (1, 1), [[False]]), "R": (np.int32, (1, 1), [[4]]),
        "C": (np.uint32, (1, 1), [[9]])}
    unbatched = control_tensors(seq.controls, SequenceFlags("7", end=True), batched=False)
    assert unbatched["S"].shape == (1,) and unbatched["E"].tolist() == [True] and unbatched["C"].tolist() == [7]


def test_initial_state_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "init").write_bytes(np.array([1.5, -2.0], np.float32).tobytes())
    seq = parse('sequence_batching { state [ { input_name: "IS" output_name: "OS" data_type: TYPE_FP32 dims: [ 2 ] '
                'initial_state [ { data_type: TYPE_FP32 dims: [ 2 ] data_file: "init" name: "i" } ] } ] }', tmp_path)
    assert seq.states[0].initial.tolist() == [[1.5, -2.0]]


STATE = 'sequence_batching {{ state [ {{ input_name: "IS" output_name: "OS" data_type: TYPE_FP32 dims: [ 2 ] {} }} ] }}'
REFUSED = [
    ('sequence_batching { control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START } ] } ] }',
     "a CONTROL_SEQUENCE_START control needs exactly one of int32_false_true, fp32_false_true or bool_false_true"),
    ('sequence_batching { control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
     'int32_false_true: [ 0, 1 ] fp32_false_true: [ 0, 1 ] } ] } ] }', "needs exactly one of"),
    ('sequence_batching { control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID '
     "data_type: TYPE_FP32 } ] } ] }", "the CORRID control's data_type must be TYPE_UINT64"),
    ('sequence_batching { control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_READY '
     'int32_false_true: [ 0, 1 ] } ] }, { name: "B" control [ { kind: CONTROL_SEQUENCE_READY '
     "int32_false_true: [ 0, 1 ] } ] } ] }", "sequence batching specifies multiple CONTROL_SEQUENCE_READY tensors"),
    ('sequence_batching { control_input [ { name: "INPUT" control [ { kind: CONTROL_SEQUENCE_READY '
     "int32_false_true: [ 0, 1 ] } ] } ] }", "the control or state input 'INPUT' is also a model input"),
    ("sequence_batching { oldest { preferred_batch_size: [ 9 ] } }", "preferred_batch_size 9 must be in"),
    ("sequence_batching { direct { minimum_slot_utilization: 1.5 } }", "minimum_slot_utilization 1.5"),
    (STATE.format('initial_state [ { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true name: "z" } ]'),
     "does not match the state data type"),
    (STATE.format('initial_state [ { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true name: "z" } ]'),
     "'initial_state' dims [3] must be fixed and match the state's dims [2]"),
    (STATE.format('initial_state [ { data_type: TYPE_FP32 dims: [ 2 ] data_file: "../../etc/passwd" name: "f" } ]'),
     "initial_state data_file '../../etc/passwd' is outside initial_state/"),
    (STATE.format('initial_state [ { data_type: TYPE_FP32 dims: [ 2 ] data_file: "missing" name: "f" } ]'),
     "initial_state/missing: cannot read"),
]


@pytest.mark.parametrize(("text", "words"), REFUSED)
def test_refused(text: str, words: str, tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    with pytest.raises(ModelLoadError) as info:
        parse(text, tmp_path)
    assert info.value.message.startswith("model 'm': ") and words in info.value.message, info.value.message


def test_a_short_initial_state_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "short").write_bytes(b"\0" * 4)
    with pytest.raises(ModelLoadError, match="initial_state setting expects 8 bytes, but the data provided from "
                                             "short only has 4 bytes"):
        parse(STATE.format('initial_state [ { data_type: TYPE_FP32 dims: [ 2 ] data_file: "short" name: "f" } ]'),
              tmp_path)

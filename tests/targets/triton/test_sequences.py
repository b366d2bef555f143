"""The runtime's per-sequence state table (mcp_runtime.SequenceState), without a server: zeros on
START, kept between requests, dropped on END or after the idle time, bounded in number."""

from __future__ import annotations

import numpy as np
import pytest

from mcp_compiler.targets.triton.emit import write_runtime
from mcp_compiler.targets.triton.verify import load_runtime

PAIRS = [{"input": "h", "output": "hn", "dtype": "float32", "shape": [2]}]


def _run(feeds, names):
    """A model whose next state is state + x and whose output is the new state."""
    hn = feeds["h"] + feeds["x"]
    return [hn, hn][:len(names)]


def test_state_kept_per_sequence_dropped_on_end_and_idle(tmp_path):
    write_runtime(tmp_path)   # the runtime as a repository carries it
    rt = load_runtime(tmp_path)
    SequenceState, StateTableFull = rt.SequenceState, rt.StateTableFull
    now = [0.0]
    t = SequenceState(PAIRS, max_sequences=2, idle_s=10, clock=lambda: now[0])
    one = {"x": np.ones(2, np.float32)}
    assert t.step(_run, one, ["y"], 1, True, False)[0].tolist() == [1, 1]
    assert t.step(_run, one, ["y"], 2, True, False)[0].tolist() == [1, 1]       # another sequence: its own zeros
    assert t.step(_run, one, ["y"], 1, False, False)[0].tolist() == [2, 2]      # sequence 1 goes on
    with pytest.raises(StateTableFull, match="2 sequences hold state"):
        t.step(_run, one, ["y"], 3, True, False)
    assert t.step(_run, one, ["y"], 1, False, True)[0].tolist() == [3, 3]       # END: dropped
    assert 1 not in t.table
    with pytest.raises(KeyError, match="did not START"):
        t.step(_run, one, ["y"], 1, False, False)
    assert t.step(_run, one, ["y"], 3, True, False)[0].tolist() == [1, 1]       # the freed slot
    now[0] = 11.0                                                               # idle past 10 s
    with pytest.raises(KeyError, match="idle past 10 s"):
        t.step(_run, one, ["y"], 2, False, False)
    assert t.table == {}


def test_a_next_state_that_does_not_fit_is_refused(tmp_path):
    write_runtime(tmp_path)
    t = load_runtime(tmp_path).SequenceState(PAIRS)

    def frames(feeds, names):   # per-frame states, not the next state (silero's sequence model)
        return [np.zeros(2, np.float32), np.zeros((3, 2), np.float32)]

    with pytest.raises(ValueError, match="cannot be served stateful"):
        t.step(frames, {"x": np.ones(2, np.float32)}, ["y"], 1, True, False)
    assert t.table == {}
